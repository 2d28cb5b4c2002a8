#!/usr/bin/env python
"""Meta-train a learned optimizer from gin configs.

    python scripts/outer_train.py --gin_file scripts/configs/quickstart.gin --output_dir /tmp/run \
        [--gin_param 'train.num_steps = 20' ...]

Writes metrics.jsonl, tb/ (TensorBoard), checkpoints/, theta_final.msgpack, config.gin (the
operative config, written once the run has started or resumed) and, when `train.eval_num_tasks > 0`,
comparison.md (learned optimizer vs Adam on held-out tasks). Re-running the same command with the
same --output_dir resumes from the newest readable checkpoint; changing a binding other than
logging, evaluation or checkpoint options (RESUME_SAFE) makes the resume fail with the differing
bindings named, leaving the directory as it was. To train a finished (or interrupted) run further,
re-run it with a larger `train.num_steps`, best with --extend (or `train.extend = True`): the run
continues from its checkpoint and the extension is recorded in the checkpoints' config history
(`outer_trainers.runs.run_checkpoints.config_history`; what continues how: `outer_trainers.outer_train`).
With --extend a `train.num_steps` below the steps already taken is refused, and horizon bindings
(`*.num_steps`, `*.decay_steps`, `*.transition_steps`, e.g. an outer learning-rate schedule's) may
change with the length; without it they must match.
A new run (no readable checkpoint, or `train.resume = False`) never starts over an earlier run's
results: it fails listing them, unless --overwrite (or `train.overwrite = True`) is given, which
deletes them (SCRIPT_RESULTS) first.

Many machines (Ray): `--gin_param 'train.num_workers = 8'` meta-trains with 8 Ray worker actors
(`outer_trainers.ray_outer_train`), on the cluster at `--ray_address` (e.g. `auto` after
`ray start --head`) or, without it, on a local Ray instance. Each worker rebuilds the estimators
from this run's gin config (`outer_trainers.learner.gin_run.GinRun`); with more workers than
estimators the estimator list is repeated so that each worker owns at least one.
`train.max_staleness` / `train.num_estimates_per_step` select the asynchronous mode;
`train.meta_eval_every` then runs in an evaluation actor. The files written are the same as in a
local run.

Every option: `train` in outer_trainers/learner/gin_run.py (this script parses the gin config and
calls it); its steps are the functions of outer_trainers/learner/meta_training_run.py.
"""
from __future__ import annotations

import argparse
import logging
from typing import Optional, Sequence

import gin

import outer_trainers as ot
from outer_trainers.devices import use_all_cpu_cores
from outer_trainers.gin_registry import gin_bindings, load_config
from outer_trainers.learner.gin_run import RESUME_SAFE, train


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """Parses the command line (`argv`, default `sys.argv[1:]`); see `--help`."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gin_file", action="append", default=[], help="gin config file (repeatable)")
    p.add_argument("--gin_param", action="append", default=[], help="gin binding, e.g. 'train.num_steps = 10'")
    p.add_argument("--output_dir", required=True, help="where metrics, theta and reports go")
    p.add_argument("--overwrite", action="store_true",
                   help="start a new run even where output_dir holds one, deleting its results first")
    p.add_argument("--extend", action="store_true",
                   help="train the run in output_dir further, to train.num_steps (more than it was run for)")
    p.add_argument("--ray_address", default=None,
                   help="meta-train on this Ray cluster ('auto', or the head node's host:port) with "
                        "train.num_workers workers (default 1 with an address; without one, num_workers > 0 "
                        "starts a local Ray instance)")
    return p.parse_args(argv)


def _bound_workers() -> int:
    """`train.num_workers` as bound in the parsed config (0 when unbound)."""
    try:
        return int(gin.query_parameter("train.num_workers"))
    except ValueError:
        return 0


def main(argv: Optional[Sequence[str]] = None) -> ot.OuterTrainState:
    """Parses the command line (`argv`, default `sys.argv[1:]`) and its gin config and runs `train`, which
    saves the config to `output_dir`/config.gin once the run may start or resume.

    Returns:
      `train`'s final state.
    """
    args = parse_args(argv)
    load_config(args.gin_file, args.gin_param)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config_str = gin.config_str()
    options = {"overwrite": True} if args.overwrite else {}  # else train.overwrite's binding (default False)
    if args.extend:
        options["extend"] = True  # else train.extend's binding (default False)
    if args.ray_address is not None:
        options["ray_address"] = args.ray_address
        if _bound_workers() < 1:
            options["num_workers"] = 1  # an address asks for workers; train.num_workers says how many
    config = {"gin_bindings": gin_bindings(config_str, ignore=RESUME_SAFE)}
    return train(args.output_dir, config=config, config_text=config_str, **options)


if __name__ == "__main__":
    use_all_cpu_cores()  # one XLA CPU device per core (unless XLA_FLAGS / JAX_NUM_CPU_DEVICES chose), before jax starts
    main()

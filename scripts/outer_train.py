#!/usr/bin/env python
"""Meta-train a learned optimizer from gin configs.

    python scripts/outer_train.py --gin_file scripts/configs/quickstart.gin --output_dir /tmp/run \
        [--gin_param 'train.num_steps = 20' ...]

What is meta-trained and for how long are the bindings of `train` (`train.task_family`,
`train.learned_opt`, `train.estimators`, `train.outer_opt`, `train.num_steps`, `train.seed`,
`train.num_workers`, ...); everything else is a settings group with bindings of its own:

    MetaEval.every = 100                 periodic meta-evaluation (every, tasks, num_tasks, num_steps, seed)
    Comparison.num_tasks = 8             the final comparison with tuned Adam (num_tasks, num_steps, adam_lrs, adam_schedule)
    Validation.every = 250               theta_best on validation tasks (every, suite, tasks, num_steps, ...)
    CheckpointPolicy.every_steps = 100   checkpoints (every_steps, every_seconds, keep, permanent_every, ...)
    Reporting.log_every = 10             progress, log_every, tensorboard, max_consecutive_dropped
    RayWorkers.max_staleness = 1         Ray workers (max_staleness, num_estimates_per_step, address, ...)

A binding of a `train` parameter that moved into a group (e.g. `train.log_every`) is refused with
its new name. Progress: by default a tqdm bar on a terminal and, with output piped to a file, a
plain line every few seconds (`Reporting.progress = "bar" | "log" | "none"` to choose).

Writes metrics.jsonl, tb/ (TensorBoard), checkpoints/, theta_final.msgpack, config.gin (the
operative config, written once the run has started or resumed) and, when `Comparison.num_tasks > 0`,
comparison.md (learned optimizer vs Adam on held-out tasks). Re-running the same command with the
same --output_dir resumes from the newest readable checkpoint; changing a binding other than those
of the settings groups, the length or the workers (RESUME_SAFE) makes the resume fail with the
differing bindings named, leaving the directory as it was. To train a finished (or interrupted) run
further, re-run it with a larger `train.num_steps`, best with --extend (or `train.extend = True`):
the run continues from its checkpoint and the extension is recorded in the checkpoints' config history
(`outer_trainers.runs.run_checkpoints.config_history`; what continues how: `outer_trainers.outer_train`).
With --extend a `train.num_steps` below the steps already taken is refused, and horizon bindings
(`*.num_steps`, `*.decay_steps`, `*.transition_steps`, e.g. an outer learning-rate schedule's) may
change with the length; without it they must match.
A new run (no readable checkpoint, or `train.resume = False`) never starts over an earlier run's
results: it fails listing them, unless --overwrite (or `train.overwrite = True`) is given, which
deletes them (SCRIPT_RESULTS) first.

Many machines (Ray): `--gin_param 'train.num_workers = 8'` meta-trains with 8 Ray worker actors
(`outer_trainers.ray_outer_train`, run by `outer_trainers.distributed.RayWorkers`), on the cluster
at `--ray_address` (e.g. `auto` after `ray start --head`) or, without it, on a local Ray instance.
Each worker rebuilds the estimators from this run's gin config
(`outer_trainers.learner.gin_run.GinRun`); with more workers than estimators the estimator list is
repeated so that each worker owns at least one. `RayWorkers.max_staleness` /
`RayWorkers.num_estimates_per_step` select the asynchronous mode. Every setting of a local run works
with workers (`train.theta_ema`, `train.theta_init`, --extend); `MetaEval.every` and `Validation.every`
run in an evaluation actor. The files written are the same as in a local run.

Every option: `train` in outer_trainers/learner/gin_run.py (this script parses the gin config and
calls it) and the groups in outer_trainers/learner/run_settings.py; its steps are the functions of
outer_trainers/learner/meta_training_run.py.
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
from typing import Optional, Sequence

import gin

import outer_trainers as ot
from outer_trainers.devices import use_all_cpu_cores
from outer_trainers.distributed import RayWorkers
from outer_trainers.gin_registry import load_config
from outer_trainers.learner.gin_run import configured, train


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
                        "starts a local Ray instance); overrides RayWorkers.address")
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
    config_text = gin.config_str()
    options = {"overwrite": True} if args.overwrite else {}  # else train.overwrite's binding (default False)
    if args.extend:
        options["extend"] = True  # else train.extend's binding (default False)
    workers = configured(RayWorkers)  # what runs Ray workers, as RayWorkers.* bind it (used with num_workers > 0)
    if args.ray_address is not None:
        workers = dataclasses.replace(workers, address=args.ray_address)
        if _bound_workers() < 1:
            options["num_workers"] = 1  # an address asks for workers; train.num_workers says how many
    return train(args.output_dir, workers=workers, config_text=config_text, **options)


if __name__ == "__main__":
    use_all_cpu_cores()  # one XLA CPU device per core (unless XLA_FLAGS / JAX_NUM_CPU_DEVICES chose), before jax starts
    main()

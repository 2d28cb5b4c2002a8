#!/usr/bin/env python
r"""Train one model with a meta-trained learned optimizer or an optax baseline, from gin configs.

    python scripts/train.py --gin_file scripts/configs/train_digits_adam.gin --output_dir /tmp/adam \
        [--gin_param 'fit.num_steps = 500' ...]
    python scripts/train.py --gin_file scripts/configs/train_digits_mlplopt.gin --output_dir /tmp/lopt \
        --gin_param 'learned_optimizer.theta_path = "/tmp/run/theta_final.msgpack"'

The loop is `outer_trainers.training.train_loop` (the one behind `train_model`): evaluation every
`EvalPlan.every` steps on `EvalPlan.evals`, EMA, rolling/permanent/best checkpoints written in the
background as `CheckpointPolicy.*` says, progress bar or log lines. `fit`'s parameters say what is
trained, for how long and how it reports; the evaluations (`EvalPlan`) and the checkpoints
(`CheckpointPolicy`) are settings groups bound by their own names, as in scripts/outer_train.py.
Writes to --output_dir: metrics.jsonl, tb/ (TensorBoard), checkpoints/, config.gin (the operative
config, written once the run may start or resume) and result.json (the mean train loss over the
last 10% of steps and the final evaluation metrics).
Re-running the same command resumes from the newest checkpoint; changing a binding other than
logging and checkpoint options (RESUME_SAFE) makes the resume fail with the differing bindings
named, changing nothing on disk. A new run refuses to start over another run's results unless
`fit.overwrite = True`.

Training a finished (or interrupted) run further: re-run with a larger `fit.num_steps` and
--extend (or `fit.extend = True`); without it the changed length is refused. With --extend the
horizon bindings may change with it (`*.num_steps`, `*.decay_steps`, `*.transition_steps`):
rebind `learned_optimizer.num_steps` (or an optax schedule's `decay_steps`) to the new length for
the optimizer to continue with the new horizon; left as they were, it runs past its old horizon
(a learned optimizer's progress features stay at 1, a decayed schedule at its end value). The
state continues from the checkpoint; the steps already taken keep the old horizon's schedule
(`outer_trainers.training.train_resume`), and the extension is recorded in the checkpoints'
config history (`outer_trainers.runs.run_checkpoints.config_history`).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
from typing import Optional, Sequence, Union

import gin
import jax
import numpy as np
import optax

import lopt
from lopt.file_io import atomic_write_bytes
from outer_trainers.runs.checkpoint_policy import CheckpointPolicy
# importing gin_registry registers the public API with gin
from outer_trainers.gin_registry import gin_bindings, load_config
from outer_trainers.learner.gin_run import configured
from outer_trainers.training.train_eval import EvalPlan
from outer_trainers.training.train_loop import TrainResult, run_to_end, run_training
from outer_trainers.training.train_resume import check_training_start
from outer_trainers.training.train_setup import LoopOptions, RunFiles, prepare_training
from tasks.base import Task

# Bindings that may change between a run and its resumption (logging, checkpointing): every other
# binding must match the checkpoint's.
RESUME_SAFE = ("fit.progress", "fit.log_every", "fit.tensorboard", "fit.resume", "fit.overwrite", "fit.extend",
               "fit.chunk_size", "CheckpointPolicy.", "outer_trainers.CheckpointPolicy.")
CONFIG_FILE = "config.gin"


@gin.configurable
def learned_optimizer(learned_opt: lopt.LearnedOptimizer = gin.REQUIRED, theta_path: Optional[str] = None,
                      init_seed: int = 0, num_steps: Optional[int] = None) -> optax.GradientTransformationExtraArgs:
    """A learned optimizer as an optax transform: `fit.optimizer = @learned_optimizer()`.

    Args:
      learned_opt: the architecture (e.g. `@MLPLOpt()`), configured as when it was meta-trained.
      theta_path: a theta file (`theta_final.msgpack` of scripts/outer_train.py, checked against
        `learned_opt`), or None for a fresh `learned_opt.init` (an untrained optimizer, for smoke tests).
      init_seed: the seed of the fresh init.
      num_steps: the training horizon the optimizer is told (None: not told).

    Returns:
      `learned_opt.opt_fn(theta, num_steps=num_steps)`.
    """
    if theta_path is not None:
        theta = lopt.load_theta(theta_path, learned_opt)
    else:
        theta = learned_opt.init(jax.random.key(init_seed))
    return learned_opt.opt_fn(theta, num_steps=num_steps)


@gin.configurable
def fit(output_dir: str, *, task: Task = gin.REQUIRED, optimizer: optax.GradientTransformation = gin.REQUIRED,
        num_steps: int = 1000, seed: int = 0, ema_decay: Optional[float] = None, ema_warmup_steps: int = 0,
        log_every: int = 100, progress: Union[bool, str] = True, tensorboard: bool = True, resume: bool = True,
        overwrite: bool = False, chunk_size: int = 100, config: Optional[dict] = None,
        config_text: Optional[str] = None, extend: bool = False) -> TrainResult:
    """Trains `task` with `optimizer` for `num_steps` steps in `output_dir` and writes result.json.

    Checks whether the run may start or resume in `output_dir` before anything is written there
    (`check_training_start`), then writes `config_text` to config.gin and trains.

    Two settings groups are built from their own gin bindings (`learner.gin_run.configured`):

      EvalPlan          every (None: only at `at` and the end), at, evals (split names or Evaluations,
                        default: "test"), batches (each split's batches), split, metrics
      CheckpointPolicy  every_steps, every_seconds (default 600), keep (3), checkpoints_at, permanent_every,
                        best_metric (a logged metric, e.g. "eval/test/loss"), best_mode, keep_best

    Args:
      output_dir: where metrics, TensorBoard summaries, checkpoints and result.json go.
      task: the model to train (e.g. `@ImageMLPTask()`).
      optimizer: an optax transform (`@optax.adam()`, or `@learned_optimizer()`).
      num_steps: training steps.
      seed: the run's PRNG seed.
      ema_decay: keep an EMA of the params with this decay, evaluated beside them (None: no EMA).
      ema_warmup_steps: steps over which the EMA decay ramps in.
      log_every: steps between metrics lines.
      progress: True or "bar" (tqdm), "log" (plain lines, for log files), False or "none".
      tensorboard: also write TensorBoard summaries.
      resume: continue from the newest checkpoint in `output_dir` (a new run refuses to replace another's results).
      overwrite: start a new run, deleting a previous run's metrics, TensorBoard files and checkpoints first.
      chunk_size: the most steps per jitted chunk.
      config: the run's config, stored with checkpoints; a resume refuses a different one (but for its
        horizon bindings, with `extend`).
      config_text: written to `output_dir`/config.gin once the run may start or resume (None: not written).
      extend: train the run in `output_dir` further, to `num_steps` from the length its checkpoint records
        (see the module docstring and `train_loop`'s `extend`).

    Returns:
      the TrainResult.
    """
    policy, evaluation = configured(CheckpointPolicy), configured(EvalPlan)
    files = RunFiles(output_dir=output_dir, policy=policy, resume=resume, overwrite=overwrite, config=config,
                     extend=extend)
    options = LoopOptions(log_every=log_every, chunk_size=chunk_size, progress=progress, tensorboard=tensorboard)
    setup = prepare_training(task, optimizer, num_steps, key=jax.random.key(seed), ema_decay=ema_decay,
                             ema_warmup_steps=ema_warmup_steps, evaluation=evaluation, files=files, options=options)
    check_training_start(setup)  # refusals raise here, before the first write
    if config_text is not None:
        os.makedirs(output_dir, exist_ok=True)
        atomic_write_bytes(os.path.join(output_dir, CONFIG_FILE), config_text.encode("utf-8"))
    result = run_to_end(run_training(setup))
    final_train_loss = float(np.mean(result.losses[-max(1, num_steps // 10):])) if num_steps else None
    summary = {"task": task.name, "num_steps": num_steps, "final_train_loss": final_train_loss,
               **{name: float(values[-1]) for name, values in result.evals.items()}}
    atomic_write_bytes(os.path.join(output_dir, "result.json"), json.dumps(summary, indent=1).encode("utf-8"))
    print(json.dumps(summary, indent=1))
    return result


def main(argv: Optional[Sequence[str]] = None) -> TrainResult:
    """Parses the command line (`argv`, default `sys.argv[1:]`; see `--help`) and its gin config and runs `fit`,
    which saves the operative config to `output_dir`/config.gin once the run may start or resume.

    Args:
      argv: the command-line arguments (None: `sys.argv[1:]`).

    Returns:
      `fit`'s TrainResult.
    """
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for flag, kwargs in (("--gin_file", dict(action="append", default=[], help="gin config file (repeatable)")),
                         ("--gin_param", dict(action="append", default=[], help="a binding: 'fit.num_steps = 10'")),
                         ("--output_dir", dict(required=True, help="where metrics, checkpoints and results go")),
                         ("--extend", dict(action="store_true", help="train the run in output_dir further, to "
                                                                    "fit.num_steps (more than it was run for)"))):
        parser.add_argument(flag, **kwargs)
    args = parser.parse_args(argv)
    load_config(args.gin_file, args.gin_param)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config_str = gin.config_str()
    options = {"extend": True} if args.extend else {}  # else fit.extend's binding (default False)
    return fit(args.output_dir, config={"gin_bindings": gin_bindings(config_str, ignore=RESUME_SAFE)},
               config_text=config_str, **options)


if __name__ == "__main__":
    main()

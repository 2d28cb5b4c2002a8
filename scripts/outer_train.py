#!/usr/bin/env python
"""Meta-train a learned optimizer from gin configs.

    python scripts/outer_train.py --gin_file scripts/configs/quickstart.gin --output_dir /tmp/run \
        [--gin_param 'train.num_steps = 20' ...]

Writes metrics.jsonl, tb/ (TensorBoard), checkpoints/, theta_final.msgpack, config.gin (the
operative config) and, when `train.eval_num_tasks > 0`, comparison.md (learned optimizer vs Adam
on held-out tasks). Re-running the same command with the same --output_dir resumes from the
latest complete checkpoint; changing a binding other than run length, logging, evaluation or
checkpoint options (RESUME_SAFE) makes the resume fail with the differing bindings named.
"""
from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from typing import Any, Callable, Optional, Sequence, Union

import gin
import jax
import optax

import outer_trainers as ot
import outer_trainers.gin_registry  # noqa: F401  (registers the public API with gin)
from lopt.base import LearnedOptimizer
from lopt.file_io import atomic_write_bytes
from outer_trainers.truncation_schedule import TruncationSchedule
from tasks.base import TaskFamily


# Bindings that may change between a run and its resumption (length, logging, evaluation, saving):
# every other binding must match the checkpoint's.
RESUME_SAFE = ("train.num_steps", "train.progress", "train.log_every", "train.tensorboard", "train.resume",
               "train.eval_", "train.meta_eval_", "train.checkpoint", "train.keep_", "train.permanent_",
               "train.best_")


def gin_bindings(config_str: str, ignore: Sequence[str] = RESUME_SAFE) -> list[str]:
    """The bindings of a gin config string, one string per binding (continuation lines joined),
    without comments and without bindings whose name starts with a prefix in `ignore`."""
    out = []
    for line in config_str.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if re.match(r"^[A-Za-z_@][\w./@-]*\s*=", line) or not out or line.startswith(("import ", "from ")):
            out.append(stripped)
        else:
            out[-1] += " " + stripped
    return [b for b in out if not b.split("=")[0].strip().startswith(tuple(ignore))]


@gin.configurable
def clipped_outer_opt(opt: optax.GradientTransformation = gin.REQUIRED,
                      max_norm: float = 1.0) -> optax.GradientTransformation:
    """`opt` after clipping the meta-gradient's global norm to `max_norm` (gin cannot bind
    optax.chain's *args): `train.outer_opt = @clipped_outer_opt()`."""
    return optax.chain(optax.clip_by_global_norm(max_norm), opt)


@gin.configurable
def train(output_dir: str, *, task_family: TaskFamily = gin.REQUIRED, learned_opt: LearnedOptimizer = gin.REQUIRED,
          trunc_sched: TruncationSchedule = gin.REQUIRED, estimators: Sequence[Callable] = gin.REQUIRED,
          estimator_weights: Optional[Sequence[float]] = None, outer_opt: optax.GradientTransformation = gin.REQUIRED,
          num_steps: int = 100, seed: int = 0, meta_loss_split: Optional[str] = None,
          eval_num_tasks: int = 0, eval_num_steps: int = 200, eval_adam_lrs: Sequence[float] = (1e-3, 3e-3, 1e-2, 3e-2),
          progress: Union[bool, str] = True, log_every: int = 1, tensorboard: bool = True, resume: bool = True,
          checkpoint_every_steps: Optional[int] = None, checkpoint_every_seconds: Optional[float] = 600.0,
          keep_checkpoints: int = 3, checkpoints_at: Sequence[int] = (), permanent_checkpoint_every: Optional[int] = None,
          best_metric: Optional[str] = "eval/final_loss", best_mode: str = "min", keep_best: int = 1,
          meta_eval_every: int = 0, meta_eval_tasks: Optional[Sequence[Any]] = None, meta_eval_num_tasks: int = 4,
          meta_eval_num_steps: int = 100, meta_eval_seed: int = 12345,
          config: Optional[dict] = None) -> ot.OuterTrainState:
    """Builds the truncated step and estimators (`estimators` are classes or factories taking the
    truncated step), runs `outer_train` (checkpointing and resuming in `output_dir`; every
    `meta_eval_every` steps training `meta_eval_tasks` — default: `task_family` — for
    `meta_eval_num_steps` steps), and optionally compares with Adam on held-out tasks at the end
    (`eval_num_tasks` > 0). `best_metric` picks "best" checkpoints when meta-evaluation runs."""
    step = ot.LOptTruncatedStep(task_family, learned_opt, trunc_sched, meta_loss_split=meta_loss_split)
    ests = [make(step) for make in estimators]
    learner = ot.GradientLearner(learned_opt, outer_opt)
    evaluator = None
    if meta_eval_every > 0:
        evaluator = ot.MetaEvaluator(learned_opt, list(meta_eval_tasks or [task_family]),
                                     num_tasks=meta_eval_num_tasks, num_steps=meta_eval_num_steps, seed=meta_eval_seed)
    policy = ot.CheckpointPolicy(every_steps=checkpoint_every_steps, every_seconds=checkpoint_every_seconds,
                                 keep=keep_checkpoints, checkpoints_at=tuple(checkpoints_at),
                                 permanent_every=permanent_checkpoint_every,
                                 best_metric=best_metric if evaluator is not None else None,
                                 best_mode=best_mode, keep_best=keep_best)
    state = ot.outer_train(learner, ests, num_steps, output_dir=output_dir, seed=seed, weights=estimator_weights,
                           progress=progress, log_every=log_every, checkpoint_policy=policy, resume=resume,
                           meta_evaluator=evaluator, eval_every=meta_eval_every, tensorboard=tensorboard,
                           config=config)
    if eval_num_tasks > 0:
        results = ot.compare_optimizers(
            task_family, lambda th: learned_opt.opt_fn(th, num_steps=eval_num_steps), state.theta,
            num_tasks=eval_num_tasks, num_steps=eval_num_steps, key=jax.random.key(seed + 10_000),
            adam_lrs=tuple(eval_adam_lrs))
        table = ot.format_comparison(results, eval_num_steps)
        title = f"Held-out {task_family.name} tasks ({eval_num_tasks} tasks, same inner steps)"
        print(f"\n{title}\n{table}")
        with open(os.path.join(output_dir, "comparison.md"), "w", encoding="utf-8") as f:
            f.write(f"# {title}\n\n{table}\n")
    return state


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gin_file", action="append", default=[], help="gin config file (repeatable)")
    p.add_argument("--gin_param", action="append", default=[], help="gin binding, e.g. 'train.num_steps = 10'")
    p.add_argument("--output_dir", required=True, help="where metrics, theta and reports go")
    return p.parse_args(argv)


def load_config(gin_files: Sequence[str], gin_params: Sequence[str]) -> None:
    """Parses gin files and bindings; raises SystemExit(2) with gin's message on any error."""
    for f in gin_files:
        if not os.path.exists(f):
            raise SystemExit(f"error: gin file {f!r} does not exist")
    try:
        gin.parse_config_files_and_bindings(gin_files, gin_params)
    except Exception as e:  # gin raises ValueError/KeyError/SyntaxError-like errors with locations
        files = ", ".join(gin_files) or "(no files)"
        print(f"error: bad gin configuration in {files}:\n{e}", file=sys.stderr)
        raise SystemExit(2) from e


def main(argv: Optional[Sequence[str]] = None) -> ot.OuterTrainState:
    args = parse_args(argv)
    load_config(args.gin_file, args.gin_param)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.makedirs(args.output_dir, exist_ok=True)
    config_str = gin.config_str()
    atomic_write_bytes(os.path.join(args.output_dir, "config.gin"), config_str.encode("utf-8"))
    return train(args.output_dir, config={"gin_bindings": gin_bindings(config_str)})


if __name__ == "__main__":
    main()

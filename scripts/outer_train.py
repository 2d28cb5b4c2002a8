#!/usr/bin/env python
"""Meta-train a learned optimizer from gin configs.

    python scripts/outer_train.py --gin_file scripts/configs/quickstart.gin --output_dir /tmp/run \
        [--gin_param 'train.num_steps = 20' ...]

Writes metrics.jsonl, theta_final.msgpack, config.gin (the operative config) and, when
`train.eval_num_tasks > 0`, comparison.md (learned optimizer vs Adam on held-out tasks).
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, Optional, Sequence

import gin
import jax
import optax

import outer_trainers as ot
import outer_trainers.gin_registry  # noqa: F401  (registers the public API with gin)
from lopt.base import LearnedOptimizer
from outer_trainers.truncation_schedule import TruncationSchedule
from tasks.base import TaskFamily


@gin.configurable
def train(output_dir: str, *, task_family: TaskFamily = gin.REQUIRED, learned_opt: LearnedOptimizer = gin.REQUIRED,
          trunc_sched: TruncationSchedule = gin.REQUIRED, estimators: Sequence[Callable] = gin.REQUIRED,
          estimator_weights: Optional[Sequence[float]] = None, outer_opt: optax.GradientTransformation = gin.REQUIRED,
          num_steps: int = 100, seed: int = 0, meta_loss_split: Optional[str] = None,
          eval_num_tasks: int = 0, eval_num_steps: int = 200, eval_adam_lrs: Sequence[float] = (1e-3, 3e-3, 1e-2, 3e-2),
          progress: bool = True) -> ot.OuterTrainState:
    """Builds the truncated step and estimators (`estimators` are classes or factories taking the
    truncated step), runs `outer_train`, and optionally compares with Adam on held-out tasks."""
    step = ot.LOptTruncatedStep(task_family, learned_opt, trunc_sched, meta_loss_split=meta_loss_split)
    ests = [make(step) for make in estimators]
    learner = ot.GradientLearner(learned_opt, outer_opt)
    state = ot.outer_train(learner, ests, num_steps, output_dir=output_dir, seed=seed, weights=estimator_weights,
                           progress=progress)
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
    os.makedirs(args.output_dir, exist_ok=True)
    with open(os.path.join(args.output_dir, "config.gin"), "w", encoding="utf-8") as f:
        f.write(gin.config_str())
    return train(args.output_dir)


if __name__ == "__main__":
    main()

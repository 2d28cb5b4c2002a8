"""Builders shared by the tests: a learned-optimizer TruncatedStep in one call, and a run's metrics lines.

    from tests.fixtures import lopt_step, metrics_lines
    step = lopt_step(4, lopt.LearnableSGD(0.1), 12)   # QuadraticFamily(dim=4), episodes of 12 steps
    lines = metrics_lines(output_dir)                 # the dicts of output_dir/metrics.jsonl

Plain functions (no pytest fixtures), so module-level run factories that Ray workers import can
use them too.
"""
from __future__ import annotations

import json
import os
from typing import Optional, Union

import lopt
import outer_trainers as ot
import tasks


def lopt_step(family: Union[int, tasks.TaskFamily] = 4, learned_opt: Optional[lopt.LearnedOptimizer] = None,
              episode: Union[int, ot.TruncationSchedule] = 12, *,
              meta_loss_split: Optional[str] = None, meta_loss_end_power: float = 0.0) -> ot.LOptTruncatedStep:
    """An `LOptTruncatedStep` from short arguments.

    Args:
      family: a TaskFamily, or d for `tasks.QuadraticFamily(dim=d)`.
      learned_opt: the learned optimizer (None: `lopt.LearnableSGD(0.1)`).
      episode: a TruncationSchedule, or T for `ConstantTruncationSchedule(T)` (episodes of T steps).
      meta_loss_split: the data split of the meta-loss (None: the normalised train loss).
      meta_loss_end_power: how much the meta-loss weighs the end of each episode (0: every step alike).

    Returns:
      the TruncatedStep.
    """
    if isinstance(family, int):
        family = tasks.QuadraticFamily(dim=family)
    if learned_opt is None:
        learned_opt = lopt.LearnableSGD(0.1)
    if isinstance(episode, int):
        episode = ot.ConstantTruncationSchedule(episode)
    return ot.LOptTruncatedStep(family, learned_opt, episode, meta_loss_split=meta_loss_split,
                                meta_loss_end_power=meta_loss_end_power)


def metrics_lines(output_dir: Union[str, os.PathLike]) -> list[dict]:
    """The JSON objects of `output_dir`/metrics.jsonl, one per logged step, in order."""
    with open(os.path.join(output_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def builtin_architectures() -> list[str]:
    """The learned-optimizer architectures lopt itself defines, sorted.

    `lopt.architectures()` also lists classes that tests (or a user's notebook) defined and
    registered; tests that must cover exactly lopt's own architectures iterate over these.
    """
    import lopt
    return [n for n in lopt.architectures() if lopt.architecture(n).__module__.startswith("lopt.")]


def torch_architectures() -> list[str]:
    """`builtin_architectures()` that lopt.torch runs (every one), sorted."""
    return builtin_architectures()


def single_torch_thread():
    """Run a test with one torch thread (tiny tensors: a second OpenMP thread only adds waits, and
    stalls on a loaded 2-core machine); restores the previous count. Use as a pytest fixture body."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# A tiny meta-training run for the gin-configured `train` (quadratics, LearnableSGD, PES): tests add
# their own bindings to it.
TINY_RUN_GIN = """
train.task_family = @QuadraticFamily()
QuadraticFamily.dim = 4
train.learned_opt = @LearnableSGD()
LearnableSGD.learning_rate = 0.01
train.trunc_sched = @ConstantTruncationSchedule()
ConstantTruncationSchedule.length = 12
train.estimators = [@TruncatedPES]
TruncatedPES.num_tasks = 2
TruncatedPES.trunc_length = 4
train.outer_opt = @optax.adam()
optax.adam.learning_rate = 0.05
"""

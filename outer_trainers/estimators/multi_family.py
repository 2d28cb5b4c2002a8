"""Meta-training on several task families at once: one gradient estimator per family.

Tasks of different static configs (datasets, widths, batch sizes) compile separately and cannot
share one vmapped estimator, so a mix of families is a list of estimators, each on its own
family, whose estimates the learner averages (`train.estimator_weights` weighs them).
`estimator_on_family` makes such an estimator from the run's truncated step (learned optimizer,
truncation schedule and meta-loss split are the run's) and another family. In gin, with scopes:

    train.estimators = [@digits/estimator_on_family, @signals/estimator_on_family]
    estimator_on_family.estimator = @TruncatedPES
    digits/estimator_on_family.task_family = @digits/ImageMLPFamily()
    digits/ImageMLPFamily.dataset = "digits"
    signals/estimator_on_family.task_family = @signals/ImageMLPFamily()
    signals/ImageMLPFamily.dataset = "signals1d"

`train.task_family` then only provides the truncation schedule's and learned optimizer's step;
the families meta-trained on are the estimators'. One estimator may take another meta-loss split
than the run's (`train.meta_loss_split`), so that held-out data makes part of the meta-objective:

    digits/estimator_on_family.meta_loss_split = "outer_valid"   # the others keep the run's split
"""
from __future__ import annotations

from typing import Callable, Optional

from outer_trainers.estimators import GradientEstimator
from outer_trainers.steps.lopt_truncated_step import LOptTruncatedStep
from tasks.base import TaskFamily


RUN_SPLIT = "run"  # estimator_on_family's default meta_loss_split: the run's truncated step's


def estimator_on_family(truncated_step: LOptTruncatedStep, *, task_family: TaskFamily,
                        estimator: Callable[[LOptTruncatedStep], GradientEstimator],
                        meta_loss_split: Optional[str] = RUN_SPLIT) -> GradientEstimator:
    """A gradient estimator on `task_family`, with `truncated_step`'s learned optimizer, truncation
    schedule and (by default) meta-loss split.

    Args:
      truncated_step: the run's `LOptTruncatedStep` (as scripts/outer_train.py passes it to each
        entry of `train.estimators`); its task family is replaced.
      task_family: the family this estimator meta-trains on.
      estimator: an estimator class or factory taking a truncated step (e.g. `TruncatedPES` with
        its arguments bound).
      meta_loss_split: this estimator's meta-loss split: `RUN_SPLIT` ("run", the default) for
        `truncated_step`'s, None for the normalised train loss, or a data split (e.g. "outer_valid").

    Returns:
      `estimator(LOptTruncatedStep(task_family, ...))`, with `truncated_step`'s `meta_loss_end_power`.

    Raises:
      TypeError: `truncated_step` is not an `LOptTruncatedStep` or `task_family` not a TaskFamily.
    """
    if not isinstance(truncated_step, LOptTruncatedStep):
        raise TypeError(f"estimator_on_family needs the run's LOptTruncatedStep, got {type(truncated_step).__name__}")
    if not isinstance(task_family, TaskFamily):
        raise TypeError(f"estimator_on_family: task_family must be a tasks.TaskFamily, got {type(task_family).__name__}")
    split = truncated_step.meta_loss_split if meta_loss_split == RUN_SPLIT else meta_loss_split
    step = LOptTruncatedStep(task_family, truncated_step.learned_opt, truncated_step.trunc_sched,
                             meta_loss_split=split, meta_loss_end_power=truncated_step.meta_loss_end_power)
    return estimator(step)

"""How torch's learning-rate schedulers meet a learned optimizer's own schedule.

A lopt optimizer's `lr` is a multiplier of the learned step (1: the step it was meta-trained to
take), and that step already follows a schedule over the horizon num_steps (the architecture's
prior warm-up and decay, and a step size the learned network reads from progress t / N). So:

- `constant_schedule(optimizer)`  the scheduler to hand a training loop that wants one (Hugging
                                  Face's Trainer): lr stays 1, the learned schedule is the only one
- `num_steps_from_epochs(...)`    the horizon N of a run stated in epochs
- `check_schedulers(optimizer)`   warns once when a scheduler changed lr (the schedules stack) or
                                  set a momentum (OneCycleLR / CyclicLR with cycle_momentum=True:
                                  the momenta are meta-trained, so it has no effect)
- `warn_if_learning_rate(lr)`     warns at construction when lr looks like a learning rate (below
                                  `LR_WARNING_BELOW`)

OneCycleLR and CyclicLR attach to a lopt optimizer with either value of cycle_momentum (its
parameter groups carry an unused "momentum" for them); they then cycle the multiplier lr.
"""
from __future__ import annotations

import math
import warnings
from typing import Any

import torch

from lopt.torch.user_line import user_stacklevel

__all__ = ["LR_WARNING_BELOW", "ScheduleWarning", "constant_schedule", "num_steps_from_epochs", "check_schedulers",
           "warn_if_learning_rate"]

#: a group's lr below this warns: it looks like a learning rate, and lr is a multiplier of the learned step
LR_WARNING_BELOW = 0.1


class ScheduleWarning(UserWarning):
    """A learning-rate scheduler scales the learned optimizer's own step-size schedule, or sets a
    momentum it does not have."""


def _one(_: int) -> float:
    return 1.0


def constant_schedule(optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
    """A scheduler that keeps every group's lr where it is (multiplier 1 at every step).

    Args:
      optimizer: the optimizer.

    Returns:
      A `torch.optim.lr_scheduler.LambdaLR` whose state_dict holds no function (it saves and loads
      with `torch.load(weights_only=True)`).
    """
    return torch.optim.lr_scheduler.LambdaLR(optimizer, _one)


def num_steps_from_epochs(epochs: float, batches_per_epoch: int, gradient_accumulation_steps: int = 1) -> int:
    """The number of optimizer steps of `epochs` passes over `batches_per_epoch` batches: the horizon
    num_steps to give a learned optimizer (as Hugging Face's Trainer counts it: each epoch's last,
    partial accumulation makes a step).

    Args:
      epochs: passes over the data (a fraction is allowed).
      batches_per_epoch: batches per pass (`len(dataloader)`).
      gradient_accumulation_steps: batches per optimizer step.

    Returns:
      ceil(epochs · max(ceil(batches_per_epoch / gradient_accumulation_steps), 1)).

    Raises:
      ValueError: a non-positive argument.
    """
    if not epochs > 0 or batches_per_epoch < 1 or gradient_accumulation_steps < 1:
        raise ValueError(f"num_steps_from_epochs needs epochs > 0, batches_per_epoch >= 1 and "
                         f"gradient_accumulation_steps >= 1, got {epochs!r}, {batches_per_epoch!r}, "
                         f"{gradient_accumulation_steps!r}")
    per_epoch = max(math.ceil(batches_per_epoch / gradient_accumulation_steps), 1)
    return int(math.ceil(epochs * per_epoch))


def warn_if_learning_rate(lr: Any, where: str) -> None:
    """Warns when a group's lr is in (0, LR_WARNING_BELOW): a learning rate's value given as the multiplier.

    Args:
      lr: the group's lr.
      where: the group, for the message.
    """
    value = float(lr)
    if 0 < value < LR_WARNING_BELOW:
        warnings.warn(f"lr={value:g} of {where}: lr is a multiplier of the learned step (1: the step the optimizer "
                      f"was meta-trained to take, with its own schedule over num_steps), not a learning rate; "
                      f"lr={value:g} shrinks every step {1 / value:.3g}x. Leave it at 1 unless you mean that",
                      UserWarning, stacklevel=user_stacklevel())


def check_schedulers(optimizer: Any, warned: set) -> None:
    """Warns once per kind (recorded in `warned`) when a scheduler changed a group's lr from its
    initial_lr, or set its momentum.

    Args:
      optimizer: a lopt torch optimizer.
      warned: the kinds already warned about ("lr", "momentum"); updated.
    """
    for i, group in enumerate(optimizer.param_groups):
        start = group.get("initial_lr")
        if "lr" not in warned and start is not None and float(group["lr"]) != float(start):
            warned.add("lr")
            warnings.warn(f"a learning-rate scheduler changed lr of parameter group {i} from {float(start):g} to "
                          f"{float(group['lr']):g}: lr multiplies the learned optimizer's step, which already "
                          f"follows its own meta-trained schedule over num_steps, so the two schedules stack. Use a "
                          f"constant schedule (lopt.torch.constant_schedule; lopt.torch.hf.optimizers returns one) "
                          f"unless you mean that", ScheduleWarning, stacklevel=user_stacklevel())
        if "momentum" not in warned and group.get("momentum") is not None:
            warned.add("momentum")
            warnings.warn(f"momentum of parameter group {i} was set to {group['momentum']!r} (by OneCycleLR or "
                          f"CyclicLR with cycle_momentum=True?): it has no effect, the momenta of "
                          f"{optimizer.source.learned_opt.name} are meta-trained. Pass cycle_momentum=False",
                          ScheduleWarning, stacklevel=user_stacklevel())

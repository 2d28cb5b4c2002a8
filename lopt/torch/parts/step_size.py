"""`lopt.parts.step_size` in torch: the bounded learned step-size head, for every item of a step at once.

    s = W₂ relu(W₁ z + b₁) + b₂,    η = base · exp(log_range · tanh(s))

z is each item's context row (`lopt.torch.rule.Context.context_row`: step embedding, progress,
loss features), so η is [L, S] for L items and S step sizes.
"""
from __future__ import annotations

from typing import Union

import torch

__all__ = ["bounded_step_sizes"]


def bounded_step_sizes(head: dict, z: torch.Tensor, base: Union[float, torch.Tensor],
                       log_range: float) -> torch.Tensor:
    """Learned step sizes bounded around `base` (`lopt.parts.step_size.bounded_step_sizes`, per row).

    Args:
      head: the head's theta as tensors: {"hidden": {"w" [C, H], "b" [H]}, "output": {"w" [H, S], "b" [S]}}.
      z: the context rows, [L, C].
      base: the step sizes at s = 0, a float or [S].
      log_range: the bound of log(η / base).

    Returns:
      [L, S], each in [base · e^−log_range, base · e^log_range].
    """
    h = torch.relu(z @ head["hidden"]["w"] + head["hidden"]["b"])
    s = h @ head["output"]["w"] + head["output"]["b"]
    return base * torch.exp(log_range * torch.tanh(s))

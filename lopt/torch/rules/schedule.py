"""The prior schedule in torch (`lopt.rules.schedule`): σ(t, N) per item, a learned step size's multiplier.

    σ(t, N) = 1                                                         "constant", or N unknown
    σ(t, N) = min((t+1)/w, 1) · ½(1 + cos(π·min(t/N, 1)))              "cosine", w = max(1, ⌈0.05 N⌉)

(0.05 is `lopt.rules.schedule.WARMUP_FRACTION`.) `item_horizons` gives each item's N.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import torch

from lopt.rules.schedule import WARMUP_FRACTION, check_schedule
from lopt.torch.rule import Context
from lopt.torch.rules.scaled import ScaledOptimizer

__all__ = ["prior_schedule", "item_horizons", "scheduled"]


def prior_schedule(name: str, ctx: Context, items) -> torch.Tensor:
    """σ(t, N) per item, [L], as `lopt.rules.schedule.prior_schedule`: 1 ("constant" or N None), else
    warm-up · ½(1 + cos(π min(t/N, 1)))."""
    ones = torch.ones_like(ctx.steps)
    if name == "constant" or all(it.horizon is None for it in items):
        return ones
    n, known = item_horizons(ctx, items)
    t = ctx.steps
    warm = torch.clamp((t + 1.0) / torch.clamp(torch.ceil(WARMUP_FRACTION * n), min=1.0), max=1.0)
    sched = warm * 0.5 * (1.0 + torch.cos(math.pi * torch.clamp(t / n, max=1.0)))
    return torch.where(known, sched, ones)


def item_horizons(ctx: Context, items) -> tuple[torch.Tensor, torch.Tensor]:
    """Each item's horizon N as a float ≥ 1 ([L]; 1 where unknown) and whether it is known ([L] bool)."""
    n = torch.tensor([float(it.horizon or 1) for it in items], dtype=ctx.dtype, device=ctx.device).clamp(min=1.0)
    return n, torch.tensor([it.horizon is not None for it in items], device=ctx.device)


def scheduled(inner: torch.optim.Optimizer, num_steps: Optional[int], name: str = "cosine",
              *, role: Optional[Callable] = None) -> ScaledOptimizer:
    """`inner` with every step times σ(t, N) (`lopt.rules.schedule.scheduled`).

    Args:
      inner: any torch optimizer.
      num_steps: the horizon N (None: σ = 1).
      name: "constant" or "cosine".
      role: accepted for symmetry with the other rules; unused.

    Returns:
      a `lopt.torch.rules.scaled.ScaledOptimizer`.
    """
    check_schedule(name)

    def factor(t, params, r):
        if name == "constant" or num_steps is None:
            return 1.0
        f32 = dict(dtype=torch.float32)
        n = torch.clamp(torch.tensor(float(num_steps), **f32), min=1.0)
        t = torch.tensor(float(t), **f32)
        warm = torch.clamp((t + 1.0) / torch.clamp(torch.ceil(WARMUP_FRACTION * n), min=1.0), max=1.0)
        return warm * 0.5 * (1.0 + torch.cos(math.pi * torch.clamp(t / n, max=1.0)))

    return ScaledOptimizer(inner, factor, role)

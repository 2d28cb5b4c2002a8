"""The horizon rule in torch (`lopt.rules.horizon`): a step-size factor for runs longer than the meta-trained ones.

    h(N) = min(1, N_ref / N)^α          (1 when N_ref = 0 or N is unknown)
"""
from __future__ import annotations

import torch

from lopt.torch.rule import Context
from lopt.torch.rules.schedule import item_horizons

__all__ = ["horizon_scale"]


def horizon_scale(reference: int, power: float, ctx: Context, items) -> torch.Tensor:
    """min(1, N_ref/N)^α per item, [L], as `lopt.rules.horizon.horizon_scale`: 1 where N_ref is 0 or N unknown."""
    ones = torch.ones_like(ctx.steps)
    if reference == 0 or all(it.horizon is None for it in items):
        return ones
    n, known = item_horizons(ctx, items)
    return torch.where(known, torch.clamp(reference / n, max=1.0) ** power, ones)

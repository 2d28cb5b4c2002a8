"""The horizon rule in torch (`lopt.rules.horizon`): a step-size factor for runs longer than the meta-trained ones.

    h(N) = min(1, N_ref / N)^α          (1 when N_ref = 0 or N is unknown)
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from lopt.rules.horizon import check_horizon_options
from lopt.torch.rule import Context
from lopt.torch.rules.scaled import ScaledOptimizer
from lopt.torch.rules.schedule import item_horizons

__all__ = ["horizon_scale", "horizon_scaled"]


def horizon_scale(reference: int, power: float, ctx: Context, items) -> torch.Tensor:
    """min(1, N_ref/N)^α per item, [L], as `lopt.rules.horizon.horizon_scale`: 1 where N_ref is 0 or N unknown."""
    ones = torch.ones_like(ctx.steps)
    if reference == 0 or all(it.horizon is None for it in items):
        return ones
    n, known = item_horizons(ctx, items)
    return torch.where(known, torch.clamp(reference / n, max=1.0) ** power, ones)


def horizon_scaled(inner: torch.optim.Optimizer, num_steps: Optional[int], reference: int, power: float = 1.0,
                   residual_power: float = 0.0, *, role: Optional[Callable] = None) -> ScaledOptimizer:
    """`inner` with every step times min(1, N_ref/N)^α (`lopt.rules.horizon.horizon_scaled`).

    Args:
      inner: any torch optimizer.
      num_steps: the horizon N (None: factor 1).
      reference: N_ref, an int ≥ 0 (0: off).
      power: α ≥ 0.
      residual_power: β of the learned residual's fade, as the JAX part's: a torch optimizer has no learned
        residual, so only 0 is taken (Celo2LOpt's torch update applies β itself, `lopt.torch.archs.celo2_lopt`).
      role: accepted for symmetry with the other rules; unused.

    Returns:
      a `lopt.torch.rules.scaled.ScaledOptimizer`.

    Raises:
      ValueError: a constant out of range, or `residual_power` > 0.
    """
    check_horizon_options(reference, horizon_power=power, residual_horizon_power=residual_power)
    if residual_power > 0:
        raise ValueError("horizon_scaled(residual_power > 0) fades a learned update's residual; a torch optimizer "
                         "has none: leave residual_power at 0")
    if reference == 0 or num_steps is None:
        f = torch.ones((), dtype=torch.float32)
    else:
        f = torch.clamp(reference / torch.tensor(max(float(num_steps), 1.0), dtype=torch.float32), max=1.0) ** power
    return ScaledOptimizer(inner, lambda t, params, r: f, role)

"""`lopt.rules.depth` in torch: the weight matrices' steps times min(1, D_ref/D)^γ."""
from __future__ import annotations

from typing import Callable, Optional

import torch

from lopt.rules.depth import check_depth_options, depth_scale
from lopt.torch.rules.scaled import ScaledOptimizer, param_role

__all__ = ["depth_scaled"]


def depth_scaled(inner: torch.optim.Optimizer, reference: int, power: float = 1.0, *,
                 role: Optional[Callable] = None) -> ScaledOptimizer:
    """`inner` with the steps of its weight matrices times min(1, D_ref/D)^γ, D the number of weight
    matrices among all its parameters (`lopt.rules.depth.depth_scaled`).

    Args:
      inner: any torch optimizer.
      reference: D_ref, an int ≥ 0 (0: off).
      power: γ ≥ 0.
      role: None, or a callable param -> role kind (`lopt.torch.rules.scaled`).

    Returns:
      a `lopt.torch.rules.scaled.ScaledOptimizer`.
    """
    check_depth_options(reference, power)
    every = [p for g in inner.param_groups for p in g["params"]]

    def factor(t, params, r):
        d = depth_scale(sum(param_role(p, r)[2] for p in every), reference, power)
        return [d if param_role(p, r)[2] else 1.0 for p in params]

    return ScaledOptimizer(inner, factor, role)

"""`lopt.rules.conv_step` in torch: every step of a model that has a conv kernel times c."""
from __future__ import annotations

from typing import Callable, Optional

import torch

from lopt.rules.conv_step import check_conv_step_scale, model_scale
from lopt.torch.rules.scaled import ScaledOptimizer, param_role

__all__ = ["conv_step_scaled"]


def conv_step_scaled(inner: torch.optim.Optimizer, scale: float, *, role: Optional[Callable] = None) -> ScaledOptimizer:
    """`inner` with every step times `scale` when one of its parameters is a conv kernel
    (`lopt.rules.conv_step.conv_step_scaled`; a kernel: a matrix of 3 or more axes in torch's layout).

    Args:
      inner: any torch optimizer.
      scale: c > 0.
      role: None, or a callable param -> role kind (`lopt.torch.rules.scaled`).

    Returns:
      a `lopt.torch.rules.scaled.ScaledOptimizer`.
    """
    check_conv_step_scale(scale)
    every = [p for g in inner.param_groups for p in g["params"]]
    return ScaledOptimizer(inner, lambda t, params, r: model_scale([param_role(p, r)[0] for p in every], scale), role)

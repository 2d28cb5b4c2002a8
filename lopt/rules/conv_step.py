"""The conv step scale: every step of a model that has a conv kernel times a constant.

    Δp ← c · Δp     for every parameter of a model with a conv kernel (c = 1 elsewhere)

A conv kernel is a parameter whose role has spatial axes (`lopt.param_roles`, `ParamRole.is_conv`).
The factor multiplies every tensor of such a model, its dense head and biases included: the
convnets measured under-fit at an MLP's step sizes, and the whole model ×3 fitted them better than
the kernels alone (docs/pretrained.md). `celo2_v9` deploys c = 3.
"""
from __future__ import annotations

from typing import Any, Sequence

import optax

from lopt.rules.scaled import known, leaf_roles, scale_updates

__all__ = ["model_scale", "check_conv_step_scale", "conv_step_scaled"]


def model_scale(roles: Sequence[Any], scale: float) -> float:
    """The factor of a whole model: `scale` when one of its parameters is a conv kernel, else 1.

    Args:
      roles: every parameter's `lopt.param_roles.ParamRole` (static).
      scale: c > 0.

    Returns:
      a Python float.
    """
    return scale if any(r.is_conv for r in roles) else 1.0


def check_conv_step_scale(scale: float) -> None:
    """Refuses c ≤ 0.

    Raises:
      ValueError: naming the value.
    """
    if known(scale) and not scale > 0:
        raise ValueError(f"conv_step_scale must be > 0 (1: conv kernels step as dense layers), got {scale!r}")


def conv_step_scaled(inner: optax.GradientTransformation, scale: float, *,
                     weight_dimension_numbers: Any = None) -> optax.GradientTransformationExtraArgs:
    """`inner` with every step times `scale` in a model that has a conv kernel (module docstring).

    Example: `lopt.rules.conv_step_scaled(optax.adamw(1e-3), 3.0)`.

    Args:
      inner: any optax transform; the wrapper's update needs `params` (the roles are read from them).
      scale: c > 0.
      weight_dimension_numbers: roles where inference from path and shape should not decide
        (`lopt.param_roles.infer`).

    Returns:
      An `optax.GradientTransformationExtraArgs` (state: `lopt.rules.scaled.ScaledState`).
    """
    check_conv_step_scale(scale)

    def factor(count, params):
        return model_scale(leaf_roles(params, weight_dimension_numbers, "conv_step_scaled"), scale)

    return scale_updates(inner, factor)

"""Orthogonalized matrix updates in torch (`lopt.parts.newton_schulz`): optax's Newton–Schulz
iteration (`newton_schulz`) and Celo2LOpt's width-scaled step (`orthogonalized_step`).

NS is optax's `orthogonalize_via_newton_schulz` (`optax.contrib.scale_by_muon`'s defaults):
Frobenius pre-normalisation with eps 1e-8, 5 quintic steps, coefficients (3.4445, −4.7750, 2.0315),
the wide orientation; width_scale = √max(1, fan_out / fan_in) (`lopt.parts.newton_schulz.width_scale`).
"""
from __future__ import annotations

import torch

from lopt import param_roles
from lopt.parts.newton_schulz import width_scale
from lopt.torch.layout import inverse_axes
from lopt.torch.rule import Item

__all__ = ["newton_schulz", "NS_COEFFS", "NS_STEPS", "orthogonalized_step"]

# optax.contrib.scale_by_muon's defaults, which NormMLPLOpt's `orthogonalize` and Celo2LOpt use
NS_COEFFS = (3.4445, -4.7750, 2.0315)
NS_STEPS = 5


def newton_schulz(x: torch.Tensor) -> torch.Tensor:
    """optax's `orthogonalize_via_newton_schulz` of a matrix (Frobenius preconditioning, 5 quintic
    steps, the wide orientation): x / (‖x‖_F + 1e-8), then x ← a x + (b A + c A²) x with A = x xᵀ.

    Args:
      x: [rows, cols], in the JAX layout (reduction axis first).

    Returns:
      The orthogonalized matrix, same shape.
    """
    transposed = x.shape[0] > x.shape[1]
    if transposed:
        x = x.t()
    x = x / (torch.linalg.vector_norm(x) + 1e-8)
    a_, b_, c_ = (torch.tensor(c, dtype=torch.float32).to(x.dtype).item() for c in NS_COEFFS)
    for _ in range(NS_STEPS):
        a = x @ x.t()
        b = b_ * a + c_ * (a @ a)
        x = a_ * x + b @ x
    return x.t() if transposed else x


def orthogonalized_step(u: torch.Tensor, it: Item, role: param_roles.ParamRole) -> torch.Tensor:
    """width_scale · NS(u) of one matrix, u flat [n] in the parameter's layout; [*param.shape].

    The JAX view (`param.permute(axes)`) is read as [fan_in, fan_out] (its input axes lead), as
    optax's `_compute_muon_reshape` reads a leaf whose reduction axes precede its output axis.
    """
    jax_shape = it.jax_shape
    fan_in = role.fan_in(jax_shape)
    mat = u.view(tuple(it.param.shape)).permute(it.axes).reshape(fan_in, -1)
    orth = newton_schulz(mat).reshape(jax_shape).permute(inverse_axes(it.axes)).contiguous()
    return orth.mul_(width_scale(jax_shape, role))

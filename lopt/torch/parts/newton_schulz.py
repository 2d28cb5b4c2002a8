"""Orthogonalized matrix updates in torch (`lopt.parts.newton_schulz`): optax's Newton–Schulz
iteration (`newton_schulz`) and Celo2LOpt's width-scaled step (`orthogonalized_step`).

NS is optax's `orthogonalize_via_newton_schulz`, with the constants of `lopt.parts.newton_schulz`
as an architecture's spec lists them ("ns_coeffs", "ns_steps", "ns_eps"): Frobenius
pre-normalisation, quintic steps, the wide orientation; width_scale = √max(1, fan_out / fan_in)
(`lopt.parts.newton_schulz.width_scale`).
"""
from __future__ import annotations

import torch

from typing import Mapping

from lopt import param_roles
from lopt.parts.newton_schulz import width_scale
from lopt.torch.layout import inverse_axes
from lopt.torch.rule import Item

__all__ = ["newton_schulz", "orthogonalized_step"]


def newton_schulz(x: torch.Tensor, constants: Mapping) -> torch.Tensor:
    """optax's `orthogonalize_via_newton_schulz` of a matrix (Frobenius preconditioning, quintic
    steps, the wide orientation): x / (‖x‖_F + ε), then `ns_steps` times x ← a x + (b A + c A²) x
    with A = x xᵀ.

    Args:
      x: [rows, cols], in the JAX layout (reduction axis first).
      constants: the spec's constants: "ns_coeffs" (a, b, c), "ns_steps", "ns_eps" (ε).

    Returns:
      The orthogonalized matrix, same shape.
    """
    transposed = x.shape[0] > x.shape[1]
    if transposed:
        x = x.t()
    x = x / (torch.linalg.vector_norm(x) + constants["ns_eps"])
    a_, b_, c_ = (torch.tensor(c, dtype=torch.float32).to(x.dtype).item() for c in constants["ns_coeffs"])
    for _ in range(constants["ns_steps"]):  # three GEMMs a step, the scalings folded into them
        a = x @ x.t()
        b = torch.addmm(a, a, a, beta=b_, alpha=c_)
        x = torch.addmm(x, b, x, beta=a_)
    return x.t() if transposed else x


def orthogonalized_step(u: torch.Tensor, it: Item, role: param_roles.ParamRole, constants: Mapping) -> torch.Tensor:
    """width_scale · NS(u) of one matrix, u flat [n] in the parameter's layout; [*param.shape]
    (`constants`: the spec's, as `newton_schulz` reads them).

    The JAX view (`param.permute(axes)`) is read as [fan_in, fan_out] (its input axes lead), as
    optax's `_compute_muon_reshape` reads a leaf whose reduction axes precede its output axis.
    """
    jax_shape = it.jax_shape
    fan_in = role.fan_in(jax_shape)
    mat = u.view(tuple(it.param.shape)).permute(it.axes).reshape(fan_in, -1)
    orth = newton_schulz(mat, constants).reshape(jax_shape).permute(inverse_axes(it.axes)).contiguous()
    return orth.mul_(width_scale(jax_shape, role))

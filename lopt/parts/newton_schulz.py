"""Orthogonalized matrix updates: optax's Newton–Schulz iteration and the μP step scale that goes with it.

For a "matrix" leaf (`lopt.param_roles`) with input axes I and output axes O, an update U is
read as the matrix [∏ shape[I], ∏ shape[O]] and replaced by its orthogonalization,

    orth(U) ≈ P Qᵀ           where U = P Σ Qᵀ is the SVD (every singular value set to ~1)

computed by optax's quintic Newton–Schulz iteration (`optax.contrib.scale_by_muon` with momentum 0,
Frobenius pre-normalisation U / (‖U‖_F + `NS_EPS`), `NS_STEPS` = 5 steps of X ← aX + (bA + cA²)X,
A = XXᵀ, with Muon's coefficients (a, b, c) = `NS_COEFFS` = (3.4445, −4.7750, 2.0315)), so it is
exactly Muon's orthogonalization. Its spectral norm is ~1 whatever the layer's width; μP's spectral condition
(Yang, Simon & Bernstein 2023) asks for ‖ΔW‖₂ ∝ √(fan_out / fan_in), and Muon (Jordan et al. 2024,
also `optax.contrib.muon`) takes

    width_scale(W) = √max(1, fan_out / fan_in)

so one step size suits layers of any width. Conv kernels (input axes spatial + in) and attention
projections ([d_model, heads, head_dim], input axis d_model) are orthogonalized as those matrices.
"""
from __future__ import annotations

import math
from typing import Sequence

import jax
import optax

from lopt.param_roles import ParamRole

__all__ = ["dimension_numbers", "is_orthogonalized", "orthogonalize", "width_scale", "NS_COEFFS", "NS_STEPS",
           "NS_EPS", "constants"]

# Muon's quintic coefficients, steps and pre-normalisation ε (optax.contrib.scale_by_muon's defaults)
NS_COEFFS = (3.4445, -4.7750, 2.0315)
NS_STEPS = 5
NS_EPS = 1e-8


def constants() -> dict:
    """The iteration's constants as an architecture's spec lists them (`lopt.parts.spec`):
    {"ns_coeffs": `NS_COEFFS`, "ns_steps": `NS_STEPS`, "ns_eps": `NS_EPS`}."""
    return {"ns_coeffs": NS_COEFFS, "ns_steps": NS_STEPS, "ns_eps": NS_EPS}


def is_orthogonalized(role: ParamRole, shape: Sequence[int]) -> bool:
    """Whether a leaf's update is orthogonalized: a "matrix" of rank ≥ 2 with more than one input
    and more than one output (a [n, 1] or [1, n] "matrix" is a vector).

    Args:
      role: the leaf's `ParamRole`.
      shape: its shape (JAX layout).

    Returns:
      a Python bool (static under jit).
    """
    shape = tuple(shape)
    if role.kind != "matrix" or len(shape) < 2 or math.prod(shape) == 0:
        return False
    fan_in = role.fan_in(shape)
    return fan_in > 1 and math.prod(shape) // fan_in > 1


def dimension_numbers(role: ParamRole, ndim: int) -> optax.contrib.MuonDimensionNumbers:
    """optax's description of a matrix leaf: its input axes and every other axis as outputs.

    Args:
      role: a "matrix" `ParamRole`.
      ndim: the leaf's rank (≥ 2).

    Returns:
      `optax.contrib.MuonDimensionNumbers(reduction_axis=role.reduction_axes, output_axis=the rest)`.
    """
    if role.kind != "matrix" or ndim < 2:
        raise ValueError(f"only a 'matrix' leaf of rank >= 2 is orthogonalized, got {role} of rank {ndim}")
    outputs = tuple(a for a in range(ndim) if a not in role.reduction_axes)
    if not outputs:
        raise ValueError(f"{role} reduces over every axis of a rank-{ndim} leaf: it has no output axis")
    return optax.contrib.MuonDimensionNumbers(reduction_axis=role.reduction_axes, output_axis=outputs)


def orthogonalize(update: jax.Array, role: ParamRole) -> jax.Array:
    """Muon's Newton–Schulz orthogonalization of one matrix leaf's update (module docstring).

    Args:
      update: float32 [*shape], rank ≥ 2.
      role: the leaf's "matrix" role (its input axes).

    Returns:
      float32 [*shape]: orth(U), singular values ~1 (in [0.7, 1.2] after Muon's 5 steps).
    """
    tx = optax.contrib.scale_by_muon(ns_coeffs=NS_COEFFS, ns_steps=NS_STEPS, beta=0.0, eps=NS_EPS, nesterov=False,
                                     weight_dimension_numbers=dimension_numbers(role, update.ndim))
    return tx.update(update, tx.init(update))[0]


def width_scale(shape: Sequence[int], role: ParamRole) -> float:
    """√max(1, fan_out / fan_in), the μP / Muon scale of an orthogonalized update.

    Args:
      shape: the leaf's shape.
      role: its "matrix" role.

    Returns:
      a Python float ≥ 1.
    """
    fan_in = role.fan_in(shape)
    fan_out = math.prod(int(shape[a]) for a in range(len(shape)) if a not in role.reduction_axes)
    return math.sqrt(max(1.0, fan_out / fan_in))

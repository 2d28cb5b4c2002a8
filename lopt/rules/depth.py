"""The depth rule: a matrix step-size factor for models with more weight matrices than meta-training saw.

    d(D) = min(1, D_ref / D)^γ          (1 when D_ref = 0)

D is the number of tensors whose update is orthogonalized (`matrix_depth`). In a chain of D
layers every layer's update moves the output, so deeper plain MLPs need smaller steps per layer;
the factor is 1 up to D_ref matrices and falls as a power of D past it.
"""
from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import optax

from lopt.parts.newton_schulz import is_orthogonalized
from lopt.rules.scaled import StepScaleRule, known, leaf_roles, scale_updates


def matrix_depth(shapes: Sequence[Any], roles: Sequence[Any]) -> int:
    """D: how many of the parameters take the orthogonalized matrix update (`is_orthogonalized`).

    In a plain MLP this is its number of layers; in a transformer every attention and MLP
    projection counts (a one-layer transformer with a dense output head: 7).

    Args:
      shapes: the parameters' shapes (JAX layout), a sequence of tuples.
      roles: their `param_roles.ParamRole`s, in the same order.

    Returns:
      D ≥ 0, a Python int (static under jit).
    """
    return sum(is_orthogonalized(r, tuple(s)) for s, r in zip(shapes, roles, strict=True))


def depth_scale(depth: int, reference: int, power: float) -> float:
    """The depth factor min(1, D_ref/D)^γ.

    Args:
      depth: D, a static int (`matrix_depth`).
      reference: D_ref ≥ 0 (0: off, the factor is 1).
      power: γ ≥ 0.

    Returns:
      the factor, a Python float in (0, 1].
    """
    if reference <= 0 or depth <= reference:
        return 1.0
    return (reference / depth) ** power


def check_depth_options(reference: Any, power: float) -> None:
    """Refuses a depth reference that is not an int ≥ 0, or a negative power.

    Raises:
      ValueError: naming the values.
    """
    if not (isinstance(reference, int) and reference >= 0 and (not known(power) or power >= 0)):
        raise ValueError(f"depth_reference must be an int >= 0 and depth_power >= 0, got {reference!r}, {power!r}")


def depth_scaled(inner: optax.GradientTransformation, reference: int, power: float = 1.0, *,
                 weight_dimension_numbers: Any = None) -> optax.GradientTransformationExtraArgs:
    """`inner` with the steps of its weight matrices times min(1, D_ref/D)^γ: depth scaling as a rule.

    D is the number of parameters that `is_orthogonalized` counts as weight matrices
    (`matrix_depth`); only those steps are scaled, biases, norms and embeddings keep theirs.
    Example: `lopt.rules.depth_scaled(optax.adamw(1e-3), reference=3)` halves the matrix steps of a
    six-layer MLP. Around a learned update that takes `lopt.rules.per_tensor`'s interface
    (`lopt.Celo2LOpt`'s) the factor multiplies the step size η of each weight matrix's own path
    (`celo2_v5` to `celo2_v9` deploy D_ref = 3, γ = 1).

    Args:
      inner: any optax transform; the wrapper's update needs `params` (roles and shapes are read from them).
      reference: D_ref, an int ≥ 0 (0: off).
      power: γ ≥ 0.
      weight_dimension_numbers: roles where inference should not decide (`lopt.param_roles.infer`).

    Returns:
      An `optax.GradientTransformationExtraArgs` (state: `lopt.rules.scaled.ScaledState`).
    """
    check_depth_options(reference, power)

    def model_factor(params):
        roles = leaf_roles(params, weight_dimension_numbers, "depth_scaled")
        shapes = [tuple(jnp.shape(p)) for p in jax.tree_util.tree_leaves(params)]
        return shapes, roles, depth_scale(matrix_depth(shapes, roles), reference, power)

    def factor(count, params):
        shapes, roles, d = model_factor(params)
        return [d if is_orthogonalized(r, s) else 1.0 for s, r in zip(shapes, roles)]

    def inside(count, params):
        d = model_factor(params)[2]
        return StepScaleRule(lambda role, shape: d if is_orthogonalized(role, tuple(shape)) else None)

    return scale_updates(inner, factor, inside)

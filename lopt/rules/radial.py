"""The no-growth rule: a learned residual direction may not inflate a weight matrix past its scale.

    r ← r − c · p,    c = min(0, ⟨r, p⟩) / ⟨p, p⟩    where rms(p) · √fan_in > g, else c = 0

r is the learned part of an update direction u that the step takes along −u (Δp = −η · (… + r)),
so a negative ⟨r, p⟩ grows ‖p‖ and a positive one shrinks it; p is the weight matrix, ⟨·,·⟩ the
sum over all its elements, fan_in the number of inputs summed into one output. Where the rule
acts, the component of r along p that would grow ‖p‖ is projected out and the rest of r,
including any component that shrinks ‖p‖, is kept. g ≥ 0 is the scale the residual may grow a
matrix to freely, in units of LeCun's initial scale (rms(p) = 1/√fan_in): 0 means everywhere. The
gradient-driven part of the update is untouched, so the weights still grow where the loss asks
for it.

Why: a learned per-parameter MLP that reads the parameter itself can learn to inflate the weights,
which lowers the training loss on its meta-training tasks. Outside them the growth can make a
model so sharp that its held-out loss explodes while its training loss looks healthy (measured on
an MLP autoencoder, where the matrices reached about 10× LeCun's scale: docs/pretrained.md).
"""
from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax

from lopt.parts.newton_schulz import is_orthogonalized
from lopt.rules import per_tensor
from lopt.rules.scaled import leaf_roles

EPS = 1e-30


def remove_growth(r: jax.Array, p: jax.Array, free: float = 0.0, fan_in: int = 1) -> jax.Array:
    """The residual direction without its component that grows ‖p‖ (see module doc).

    Args:
      r: the residual direction, any shape with as many elements as p, float32.
      p: the weight matrix, the same number of elements.
      free: g ≥ 0: the rule acts only where rms(p) · √fan_in > g (0: wherever ‖p‖ > 0).
      fan_in: the matrix's fan-in (`lopt.param_roles.ParamRole.fan_in`).

    Returns:
      r − min(0, ⟨r, p⟩) / ⟨p, p⟩ · p where the rule acts, else r; in r's shape. r itself where p is zero.
    """
    p = jnp.reshape(p, jnp.shape(r)).astype(r.dtype)
    inner, sq = jnp.sum(r * p), jnp.sum(p * p)
    coef = jnp.minimum(inner, 0.0) / (sq + EPS)
    if free > 0:
        coef = jnp.where(sq / p.size * fan_in > free * free, coef, 0.0)
    return r - coef * p


@flax.struct.dataclass
class GrowthLimitState:
    """The growth limit's state: the wrapped optimizer's (the rule keeps none of its own).

    Attributes:
      inner: the wrapped optimizer's state.
    """
    inner: Any


def growth_limited(inner: optax.GradientTransformation, free: float = 4.0, *,
                   weight_dimension_numbers: Any = None) -> optax.GradientTransformationExtraArgs:
    """`inner` whose steps may not grow a weight matrix's norm past `free` × LeCun's scale (module docstring).

    On every weight matrix p (`lopt.parts.newton_schulz.is_orthogonalized`) with rms(p) · √fan_in > g,
    the step Δp loses its component along p that grows ‖p‖:

        Δp ← Δp − max(0, ⟨Δp, p⟩) / ⟨p, p⟩ · p

    (`remove_growth` with r = −Δp). Wrapped around a whole update this limits the gradient-driven part
    too. Around a learned update that takes `lopt.rules.per_tensor`'s interface (e.g. `lopt.Celo2LOpt`'s)
    it acts on its learned residual r alone, r ← `remove_growth(r, p, free, fan_in)`, before the
    direction is formed (as `celo2_v7` to `celo2_v9` deploy it); the rest of the step is untouched. Example: `lopt.rules.growth_limited(optax.adamw(1e-3), 4.0)`.

    Args:
      inner: any optax transform; the wrapper's update needs `params`.
      free: g ≥ 0 (0: on every nonzero matrix).
      weight_dimension_numbers: roles where inference should not decide (`lopt.param_roles.infer`).

    Returns:
      An `optax.GradientTransformationExtraArgs` whose state is a `GrowthLimitState` (a
      `PerTensorTransform` where `inner` is one).
    """
    if not free >= 0:
        raise ValueError(f"growth_limited needs free >= 0, got {free!r}")
    inner = optax.with_extra_args_support(inner)

    def update_fn(updates, state, params=None, **extra_args):
        if per_tensor.supports(inner):  # on the learned residual, inside the update
            rule = GrowthLimitRule(free)
            steps, inner_state = inner.update(updates, state.inner, params, **per_tensor.forward(inner, rule, extra_args))
            return steps, GrowthLimitState(inner=inner_state)
        steps, inner_state = inner.update(updates, state.inner, params, **per_tensor.forward(inner, None, extra_args))
        roles = leaf_roles(params, weight_dimension_numbers, "growth_limited")
        leaves, treedef = jax.tree_util.tree_flatten(steps)
        out = []
        for s, p, r in zip(leaves, treedef.flatten_up_to(params), roles):
            shape = tuple(jnp.shape(p))
            if is_orthogonalized(r, shape):
                s32 = jnp.asarray(s, jnp.float32)
                s = (-remove_growth(-s32, jnp.asarray(p, jnp.float32), free, r.fan_in(shape))).astype(jnp.result_type(s))
            out.append(s)
        return treedef.unflatten(out), GrowthLimitState(inner=inner_state)

    return per_tensor.wrap(inner, lambda params: GrowthLimitState(inner=inner.init(params)), update_fn)


class GrowthLimitRule(per_tensor.TensorRule):
    """`growth_limited` given to a learned update (`lopt.rules.per_tensor`): its residual r loses the part
    that grows ‖p‖ (`remove_growth`) in every matrix past rms(p) · √fan_in = `free`.

    Args:
      free: g ≥ 0.
    """

    def __init__(self, free: float):
        self.free = free

    def residual(self, r, p, role, shape):
        """`remove_growth(r, p, free, role.fan_in(shape))`."""
        return remove_growth(r, p, self.free, role.fan_in(shape))

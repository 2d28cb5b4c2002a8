"""The overshoot brake: scales an optimizer's steps down while they overshoot.

A step size that suits some tasks can be far too large for another (a learned one meta-trained on
classifiers, on a digits autoencoder that wants a tenth of it). Its steps then overshoot: the next
gradient points back along the last step. The brake measures that with the hypergradient's sign,
the cosine over all parameters

    c_t = ⟨g_t, Δp_{t−1}⟩ / (‖g_t‖ ‖Δp_{t−1}‖)      (0 at t = 0; > 0: the last step went uphill)

(⟨g_t, Δp_{t−1}⟩ / η is dL/dη of the last step, Baydin et al. 2018's hypergradient) and scales every
step of the wrapped optimizer by α_t ∈ [floor, 1]:

    log α_t = clip(log α_{t−1} − κ (c_t − c₀), log floor, 0)       κ = gain, c₀ = threshold
    Δp_t   = α_t · (the wrapped optimizer's Δp_t)

It only brakes: α ≤ 1, so no bound of the wrapped optimizer is loosened, and it lets go as soon as
the steps stop overshooting (c_t < c₀ raises α back towards 1). Below the threshold nothing
changes: with α = 1 throughout, the updates are bit-identical to the wrapped optimizer's.
Measured with the shipped normmlp_v3 (docs/pretrained.md): c_t ≈ 0–0.1 on held-out classifiers,
0.2–0.5 after the warm-up on the digits autoencoder. Its state holds Δp_{t−1} (one float32 copy
of the parameters) and log α.

    tx = overshoot_brake(optax.adam(1e-2), gain=0.2)
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from lopt.parts.layout import is_sharded
from lopt.parts.spec import PARAM, STEP, StateField
from lopt.parts.tree_checks import check_real_floating

__all__ = ["OvershootBrakeState", "overshoot_brake", "brake_step", "check_options", "state_fields", "FLOOR"]

FLOOR = 0.01


class OvershootBrakeState(NamedTuple):
    """The brake's state around the wrapped optimizer's.

    Attributes:
      inner: the wrapped optimizer's state.
      prev_update: per leaf, float32 [*p.shape]: the last step Δp_{t−1} (zeros before the first).
      log_brake: float32 []: log α_{t−1}.
    """
    inner: Any
    prev_update: Any
    log_brake: jax.Array


def brake_step(log_brake: jax.Array, grads: list, prev_steps: list, gain: float, threshold: float,
               floor: float = FLOOR) -> jax.Array:
    """log α_t from log α_{t−1}, g_t and Δp_{t−1} (module docstring).

    Args:
      log_brake: log α_{t−1}, float32 [].
      grads: g_t, float32 arrays (one per parameter).
      prev_steps: Δp_{t−1}, float32 arrays of the same shapes (all zeros: c_t = 0).
      gain: κ ≥ 0.
      threshold: c₀.
      floor: the smallest α.

    Returns:
      float32 []: clip(log α_{t−1} − κ (c_t − c₀), log floor, 0).
    """
    zero = jnp.zeros((), jnp.float32)
    dot = sum((_inner(g, d) for g, d in zip(grads, prev_steps)), zero)
    gg = sum((_inner(g, g) for g in grads), zero)
    dd = sum((_inner(d, d) for d in prev_steps), zero)
    # the double where: at dd = 0 (t = 0) rsqrt's derivative at 1e-37 overflows, and 0 · inf would
    # make jax.grad through the update NaN; the inner where keeps that branch's argument at 1
    some = dd > 0
    cos = jnp.where(some, dot * jax.lax.rsqrt(jnp.where(some, jnp.maximum(gg * dd, 1e-37), 1.0)), 0.0)
    return jnp.clip(log_brake - gain * (cos - threshold), math.log(floor), 0.0)


def _inner(a: jax.Array, b: jax.Array) -> jax.Array:
    """⟨a, b⟩ over every element: a flat dot product, or, for a tensor sharded over an explicit mesh
    (which cannot be flattened), the sum of the elementwise product over its own shape."""
    return jnp.sum(a * b) if is_sharded(a) else jnp.vdot(a, b)


def state_fields() -> tuple:
    """The brake's entries in an architecture's spec (`lopt.parts.spec.StateField`s): "prev_update",
    Δp_{t−1} per parameter, and "log_brake", log α_{t−1} [], both kept by `TorchLearnedOptimizer` for
    the whole model rather than per parameter."""
    return (StateField("prev_update", PARAM, torch_per_param=False, doc="the brake's Δp_{t−1}"),
            StateField("log_brake", STEP, torch_per_param=False, doc="the brake's log α_{t−1}"))


def check_options(gain: float, threshold: float) -> None:
    """The check of an architecture's `overshoot_gain` / `overshoot_threshold` options (gain 0: no brake).

    Raises:
      ValueError: gain < 0 or threshold outside [0, 1), naming both options.
    """
    if not (gain >= 0 and 0 <= threshold < 1):
        raise ValueError(f"overshoot_gain must be >= 0 (0: off) and overshoot_threshold in [0, 1), got "
                         f"{gain}, {threshold}")


def overshoot_brake(inner: optax.GradientTransformation, gain: float, threshold: float = 0.15,
                    floor: float = FLOOR) -> optax.GradientTransformationExtraArgs:
    """`inner` with its steps scaled by the overshoot brake's α_t (module docstring).

    Args:
      inner: the optimizer to brake (its update may read params and extra args such as `loss`).
      gain: κ > 0, how fast α falls per step of overshoot.
      threshold: c₀ in [0, 1): the cosine between a gradient and the last step above which α falls.
      floor: the smallest α, in (0, 1].

    Returns:
      An `optax.GradientTransformationExtraArgs` whose state is an `OvershootBrakeState`.

    Raises:
      ValueError: gain, threshold or floor out of range.
    """
    if not gain > 0 or not 0 <= threshold < 1 or not 0 < floor <= 1:
        raise ValueError(f"overshoot_brake needs gain > 0, 0 <= threshold < 1 and 0 < floor <= 1, got {gain}, "
                         f"{threshold}, {floor}")
    inner = optax.with_extra_args_support(inner)

    def init_fn(params):
        prev = jax.tree_util.tree_map(lambda p: jnp.zeros_like(p, jnp.float32), params)  # sharded as p
        return OvershootBrakeState(inner.init(params), prev, jnp.zeros((), jnp.float32))

    def update_fn(updates, state, params=None, **extra_args):
        check_real_floating(updates, updates, "overshoot_brake")  # the cosine is of real gradients
        treedef = jax.tree_util.tree_structure(updates)
        grads = [jnp.asarray(g, jnp.float32) for g in treedef.flatten_up_to(updates)]
        log_brake = brake_step(state.log_brake, grads, treedef.flatten_up_to(state.prev_update), gain, threshold, floor)
        steps, inner_state = inner.update(updates, state.inner, params, **extra_args)
        alpha = jnp.exp(log_brake)
        steps32 = [alpha * jnp.asarray(s, jnp.float32) for s in treedef.flatten_up_to(steps)]
        out = treedef.unflatten([s.astype(jnp.result_type(u)) for s, u in zip(steps32, treedef.flatten_up_to(steps))])
        return out, OvershootBrakeState(inner_state, treedef.unflatten(steps32), log_brake)

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)

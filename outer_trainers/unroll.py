"""Batched unrolls of a TruncatedStep: particles on a leading axis, steps in one lax.scan.

Antithetic estimators stack the + and − particles on the particle axis ([+ ×N; − ×N]) so one
vmapped step advances all 2N of them; each ± pair shares its step keys (same data, same
resets), which is what makes their loss difference low-variance.
"""
from __future__ import annotations

from typing import Any, Optional

import jax
import jax.flatten_util
import jax.numpy as jnp

from outer_trainers.truncated_step import StepOut, TruncatedStep


def tree_stack_pm(theta: Any, eps: Any) -> Any:
    """[θ + ε ; θ − ε] stacked on a new leading axis: eps [N, ...] -> [2N, ...]."""
    return jax.tree_util.tree_map(lambda t, e: jnp.concatenate([t + e, t - e], axis=0), theta, eps)


def sample_perturbations(theta: Any, key: jax.Array, num: int, std: float) -> Any:
    """ε ~ N(0, std² I) shaped like theta with a leading [num] axis.

    One normal draw over the flattened theta (not one per leaf): every random-bits call site
    is a separate threefry kernel for XLA to compile.
    """
    flat, unravel = jax.flatten_util.ravel_pytree(theta)
    eps = std * jax.random.normal(key, (num,) + flat.shape, flat.dtype)
    return jax.vmap(unravel)(eps)


def init_particles(ts: TruncatedStep, theta: Any, key: jax.Array, num: int, *, outer_state: Optional[Any] = None,
                   data: Optional[Any] = None, max_offset: int = 0) -> Any:
    """`num` fresh particles of `ts` with a shared theta; with `max_offset` > 0 each starts a
    uniform-random number of steps in [0, max_offset] into its first episode (staggered resets)."""
    k_init, k_off = jax.random.split(key)
    keys = jax.random.split(k_init, num)
    if max_offset <= 0:
        return jax.vmap(lambda k: ts.init(theta, k, outer_state=outer_state, data=data))(keys)
    offsets = jax.random.randint(k_off, (num,), 0, max_offset + 1)
    try:
        return jax.vmap(lambda k, o: ts.init(theta, k, outer_state=outer_state, data=data, initial_offset=o))(
            keys, offsets)
    except TypeError as e:
        if "initial_offset" not in str(e):
            raise
        raise TypeError(f"{type(ts).__name__}.init takes no initial_offset, so random_initial_iteration_offset "
                        f"cannot stagger it; set random_initial_iteration_offset=0") from e


def tile(tree: Any, reps: int) -> Any:
    """Repeats a batched tree `reps` times along its leading axis."""
    return jax.tree_util.tree_map(lambda x: jnp.concatenate([x] * reps, axis=0), tree)


def unroll(ts: TruncatedStep, thetas: Any, states: Any, key: jax.Array, num_steps: int, *,
           theta_batched: bool = True, key_groups: int = 1, outer_state: Optional[Any] = None,
           data: Optional[Any] = None) -> tuple[Any, StepOut]:
    """Runs `num_steps` steps of all P particles (vmap over particles, scan over steps).

    thetas: [P, ...] if `theta_batched` else one theta shared by all particles.
    key_groups: particles i, i + P/g, i + 2P/g, ... share step keys (2 for ± pairs) and end
    their episodes together (`TruncatedStep.batched_step`'s reset_groups).
    Returns the final states and StepOut with leaves [num_steps, P].
    """
    num = jax.tree_util.tree_leaves(states)[0].shape[0]
    if num % key_groups:
        raise ValueError(f"{num} particles do not split into {key_groups} key groups")
    keys = step_keys(key, num_steps, num // key_groups)
    if key_groups > 1:
        keys = jnp.concatenate([keys] * key_groups, axis=1)
    return unroll_with_keys(ts, thetas, states, keys, theta_batched=theta_batched, outer_state=outer_state,
                            data=data, reset_groups=key_groups)


def step_keys(key: jax.Array, num_steps: int, num: int) -> jax.Array:
    """The [num_steps, num] step keys of an unroll, in one draw (one threefry kernel to compile)."""
    return jax.random.split(key, (num_steps, num))


def unroll_with_keys(ts: TruncatedStep, thetas: Any, states: Any, keys: jax.Array, *, theta_batched: bool = True,
                     outer_state: Optional[Any] = None, data: Optional[Any] = None,
                     reset_groups: int = 1) -> tuple[Any, StepOut]:
    """`unroll` with explicit step keys [T, P]: scan over T of `ts.batched_step`."""
    def body(carry, ks):
        return ts.batched_step(thetas, carry, ks, theta_batched=theta_batched, outer_state=outer_state, data=data,
                               reset_groups=reset_groups)

    return jax.lax.scan(body, states, keys)


"""Batched unrolls of a TruncatedStep: particles on a leading axis, steps in one lax.scan.

    states = init_particles(ts, theta, key, num)                       # leaves [num, ...]
    states, out = unroll(ts, thetas, states, key, num_steps)           # out leaves [num_steps, P]

Particles in one reset group (`reset_groups=2`: the ± halves of antithetic pairs, stacked as
[+ ×N; − ×N]) share their step keys and end their episodes together (`TruncatedStep.batched_step`).
"""
from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp

from outer_trainers.steps.truncated_step import StepOut, TruncatedStep


def init_particles(ts: TruncatedStep, theta: Any, key: jax.Array, num: int, *, outer_state: Optional[Any] = None,
                   data: Optional[Any] = None, max_offset: int = 0) -> Any:
    """`num` fresh particles of `ts` sharing one theta, optionally staggered.

    Args:
        ts: the TruncatedStep.
        theta: the meta-parameters every particle is initialised with.
        key: PRNG key; particle i's init key is split(split(key)[0], num)[i].
        num: the number of particles.
        outer_state: the outer iteration or None.
        data: the arrays of `ts.data_args()` as passed through jit, or None.
        max_offset: if > 0, each particle starts a uniform-random number of steps in
            [0, max_offset] into its first episode (`TruncatedStep.init`'s initial_offset),
            which staggers the particles' resets.

    Returns:
        Particle states with leaves [num, ...].
    """
    k_init, k_off = jax.random.split(key)
    keys = jax.random.split(k_init, num)
    if max_offset <= 0:
        return jax.vmap(lambda k: ts.init(theta, k, outer_state=outer_state, data=data))(keys)
    offsets = jax.random.randint(k_off, (num,), 0, max_offset + 1)
    return jax.vmap(lambda k, o: ts.init(theta, k, outer_state=outer_state, data=data, initial_offset=o))(
        keys, offsets)


def tile(tree: Any, reps: int) -> Any:
    """Repeats a batched tree `reps` times along its leading axis: leaves [P, ...] -> [reps·P, ...]."""
    return jax.tree_util.tree_map(lambda x: jnp.concatenate([x] * reps, axis=0), tree)


def step_keys(key: jax.Array, num_steps: int, num: int) -> jax.Array:
    """The [num_steps, num] step keys of an unroll, in one draw (one threefry kernel to compile)."""
    return jax.random.split(key, (num_steps, num))


def unroll(ts: TruncatedStep, thetas: Any, states: Any, key: jax.Array, num_steps: int, *,
           theta_batched: bool = True, reset_groups: int = 1, outer_state: Optional[Any] = None,
           data: Optional[Any] = None) -> tuple[Any, StepOut]:
    """Runs `num_steps` steps of all P particles (vmap over particles, scan over steps).

    Particle i's step-t key is step_keys(key, num_steps, P / g)[t, i mod P/g] for g = reset_groups,
    so the members of a reset group share their keys.

    Args:
        ts: the TruncatedStep.
        thetas: meta-parameters with a leading [P] axis, or one θ for all if not `theta_batched`.
        states: particle states with a leading [P] axis.
        key: PRNG key of the unroll.
        num_steps: T, the number of steps.
        theta_batched: whether `thetas` has the particle axis.
        reset_groups: g; particles i, i + P/g, i + 2P/g, ... share step keys and end their
            episodes together (2 for ± pairs); P must be a multiple of g.
        outer_state: the outer iteration or None.
        data: the arrays of `ts.data_args()` as passed through jit, or None.

    Returns:
        (states, StepOut): the final states and the steps' outputs with leaves [T, P].
    """
    num = jax.tree_util.tree_leaves(states)[0].shape[0]
    if num % reset_groups:
        raise ValueError(f"{num} particles do not split into {reset_groups} reset groups")
    keys = step_keys(key, num_steps, num // reset_groups)
    if reset_groups > 1:
        keys = jnp.concatenate([keys] * reset_groups, axis=1)
    return unroll_with_keys(ts, thetas, states, keys, theta_batched=theta_batched, outer_state=outer_state,
                            data=data, reset_groups=reset_groups)


def unroll_with_keys(ts: TruncatedStep, thetas: Any, states: Any, keys: jax.Array, *, theta_batched: bool = True,
                     outer_state: Optional[Any] = None, data: Optional[Any] = None,
                     reset_groups: int = 1) -> tuple[Any, StepOut]:
    """`unroll` with explicit step keys: a lax.scan of `ts.batched_step` over their leading axis.

    Args:
        ts: the TruncatedStep.
        thetas: as in `unroll`.
        states: particle states with a leading [P] axis.
        keys: [T, P] step keys (the members of a reset group must have equal keys).
        theta_batched: as in `unroll`.
        outer_state: the outer iteration or None.
        data: the arrays of `ts.data_args()` as passed through jit, or None.
        reset_groups: as in `unroll`.

    Returns:
        (states, StepOut) as in `unroll`.
    """
    def body(carry, ks):
        return ts.batched_step(thetas, carry, ks, theta_batched=theta_batched, outer_state=outer_state, data=data,
                               reset_groups=reset_groups)

    return jax.lax.scan(body, states, keys)

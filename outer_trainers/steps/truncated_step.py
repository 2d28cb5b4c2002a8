"""TruncatedStep: the unrolled system that gradient estimators differentiate, for ONE particle.

    state = ts.init(theta, key, outer_state=None, data=None, initial_offset=0)
    state, out = ts.step(theta, state, key, outer_state=None, data=None)   # out: StepOut

`out.loss` is that step's meta-loss contribution and `out.is_done` says the particle's episode
ended with this step (the returned state is then already reset). Estimators add the vmap over
particles and the lax.scan over steps; `batched_step` is the vmapped step, and particles in
one reset group (the ± halves of an antithetic pair) end their episodes together.

`data_args()` returns the pytree of arrays (e.g. a DataSource) the step reads; estimators pass
it into their jitted functions as an argument and hand it back as `data=`, so large datasets
are never baked into compiled programs as constants.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
from flax import struct

from outer_trainers.tree_utils import tree_where


@struct.dataclass
class StepOut:
    """What one step of one particle reports.

    Attributes:
        loss: float32 [], the step's meta-loss contribution.
        is_done: bool [], whether the particle's episode ended with this step (the returned
            state is then already reset).
        mask: bool [], False drops the step from estimates (e.g. a non-finite loss); default True.
        metrics: dict of per-step scalars, e.g. "nonfinite" (int32 [], 1 for a non-finite step),
            which estimators sum into their own metrics.
    """

    loss: jax.Array
    is_done: jax.Array
    mask: jax.Array = True
    metrics: dict = struct.field(default_factory=dict)


class TruncatedStep:
    """Base class of unrolled systems parameterised by θ (see the module docstring).

    Subclasses implement `init` and `step`; they may override `batched_step` to do the same
    work faster, `data_args` if the step reads arrays, and `name` / `max_episode_length`.
    """

    @property
    def name(self) -> str:
        """A short label of the system, used in metric names and logs (default: the class name)."""
        return type(self).__name__

    @property
    def max_episode_length(self) -> Optional[int]:
        """The longest episode the system can run, in steps; None if unknown or never-ending.

        FullES and FullGrad unroll this many steps unless given an `unroll_length`.
        """
        return None

    def init(self, theta: Any, key: jax.Array, *, outer_state: Optional[Any] = None, data: Optional[Any] = None,
             initial_offset: Any = 0) -> Any:
        """A fresh particle: the state at the start of an episode.

        Args:
            theta: the meta-parameters.
            key: PRNG key of the particle (e.g. which task it samples).
            outer_state: the outer iteration (for curricula) or None; may be ignored.
            data: the arrays of `data_args()` as passed through jit, or None.
            initial_offset: int (a traced int32 [] is fine), start that many steps into the first
                episode, which staggers the resets of particles; systems without episodes may
                ignore it.

        Returns:
            The particle's state, a pytree.
        """
        raise NotImplementedError

    def step(self, theta: Any, state: Any, key: jax.Array, *, outer_state: Optional[Any] = None,
             data: Optional[Any] = None) -> tuple[Any, StepOut]:
        """One step of one particle; resets the particle when its episode ends.

        Args:
            theta: the meta-parameters.
            state: the particle's state.
            key: PRNG key of this step.
            outer_state: the outer iteration or None; may be ignored.
            data: the arrays of `data_args()` as passed through jit, or None.

        Returns:
            (state, StepOut): the new state (already reset if `is_done`) and what the step reports.
        """
        raise NotImplementedError

    def batched_step(self, thetas: Any, states: Any, keys: jax.Array, *, theta_batched: bool = True,
                     outer_state: Optional[Any] = None, data: Optional[Any] = None,
                     reset_groups: int = 1) -> tuple[Any, StepOut]:
        """`step` for P particles at once.

        With reset_groups=1 it equals `jax.vmap(step)`; subclasses override it only to do the
        same work faster (e.g. run resets only on steps where some particle's episode ended).

        reset_groups=g: particles i, i + P/g, i + 2P/g, ... form a group (the ± halves of an
        antithetic pair) that shares its step keys and ends its episodes together. If the step
        ends the episode of some but not all of a group (a non-finite loss on one side), every
        member restarts from `init(θ, its step key)` — the same fresh task for all, since their
        keys are equal — so the pair never goes on comparing losses of different tasks. Groups
        that all end at once keep their own resets.

        Args:
            thetas: meta-parameters with a leading [P] axis, or one θ for all if not `theta_batched`.
            states: particle states with a leading [P] axis.
            keys: [P] step keys.
            theta_batched: whether `thetas` has the particle axis.
            outer_state: the outer iteration or None.
            data: the arrays of `data_args()` as passed through jit, or None.
            reset_groups: g, the number of members per reset group; P must be a multiple of it.

        Returns:
            (states, StepOut) with leaves [P, ...]; `is_done` is that of the whole group.
        """
        step = lambda th, s, k: self.step(th, s, k, outer_state=outer_state, data=data)
        th_axis = 0 if theta_batched else None
        states, out = jax.vmap(step, in_axes=(th_axis, 0, 0))(thetas, states, keys)
        if reset_groups == 1:
            return states, out
        done, split = group_episode_ends(out.is_done, reset_groups)
        fresh = lambda: jax.vmap(lambda th, k: self.init(th, k, outer_state=outer_state, data=data),
                                 in_axes=(th_axis, 0))(thetas, keys)
        return reset_where(split, states, fresh), out.replace(is_done=done)

    def data_args(self) -> Any:
        """Arrays to pass into jit as `data=` (None if the step reads no data)."""
        return None


def group_episode_ends(is_done: jax.Array, groups: int) -> tuple[jax.Array, jax.Array]:
    """The episode ends of reset groups: particles i ≡ j (mod P/groups) form one group.

    Args:
        is_done: bool [P], whether each particle's episode ended.
        groups: members per group; P must be a multiple of it.

    Returns:
        (ended, split), bool [P] each: ended[i] = some member of i's group ended its episode,
        split[i] = some but not all did. With groups=1, (is_done, all False).
    """
    if groups == 1:
        return is_done, jnp.zeros_like(is_done)
    ended = jnp.tile(jnp.any(is_done.reshape(groups, -1), axis=0), groups)
    return ended, ended & ~jnp.tile(jnp.all(is_done.reshape(groups, -1), axis=0), groups)


def reset_where(pred: jax.Array, states: Any, fresh: Callable[[], Any]) -> Any:
    """`states` with particle i replaced by `fresh()`'s where pred[i].

    `fresh` runs under `lax.cond` only on steps where some pred holds, so the (costly) init of
    new particles is skipped on the many steps where no episode ends.

    Args:
        pred: bool [P].
        states: particle states with a leading [P] axis.
        fresh: () -> fresh particle states of the same structure.

    Returns:
        The particle states, [P, ...].
    """
    return jax.lax.cond(jnp.any(pred), lambda s: tree_where(pred, fresh(), s), lambda s: s, states)

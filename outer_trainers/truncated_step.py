"""TruncatedStep: the unrolled system that gradient estimators differentiate, for ONE particle.

    state = ts.init(theta, key, outer_state=None, data=None)
    state, out = ts.step(theta, state, key, outer_state=None, data=None)   # out: StepOut

`out.loss` is that step's meta-loss contribution and `out.is_done` says the particle's episode
ended with this step (the returned state is then already reset). Estimators add the vmap over
particles and the lax.scan over steps.

`data_args()` returns the pytree of arrays (e.g. a DataSource) the step reads; estimators pass
it into their jitted functions as an argument and hand it back as `data=`, so large datasets
are never baked into compiled programs as constants.
"""
from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp
from flax import struct

from outer_trainers.tree_utils import tree_where


@struct.dataclass
class StepOut:
    loss: jax.Array  # float32 []: meta-loss contribution of this step
    is_done: jax.Array  # bool []: the episode ended with this step (state already reset)
    mask: jax.Array = True  # bool []: False drops this step from estimates (e.g. non-finite)
    metrics: dict = struct.field(default_factory=dict)


class TruncatedStep:
    """Base class of unrolled systems (see the module docstring for the contract)."""

    @property
    def name(self) -> str:
        """A short label of the system, used in metric names and logs (default: the class name)."""
        return type(self).__name__

    def init(self, theta: Any, key: jax.Array, *, outer_state: Optional[Any] = None,
             data: Optional[Any] = None) -> Any:
        raise NotImplementedError

    def step(self, theta: Any, state: Any, key: jax.Array, *, outer_state: Optional[Any] = None,
             data: Optional[Any] = None) -> tuple[Any, StepOut]:
        raise NotImplementedError

    def batched_step(self, thetas: Any, states: Any, keys: jax.Array, *, theta_batched: bool = True,
                     outer_state: Optional[Any] = None, data: Optional[Any] = None,
                     reset_groups: int = 1) -> tuple[Any, StepOut]:
        """`step` for P particles at once (states and keys [P, ...]; thetas too if `theta_batched`).

        With reset_groups=1 it must equal `jax.vmap(step)`; subclasses override it only to do the
        same work faster (e.g. run resets only on steps where some particle's episode ended).

        reset_groups=g: particles i, i + P/g, i + 2P/g, ... (the ± halves of an antithetic pair,
        which share their step keys) end their episodes together. If the step ends the episode
        of some but not all of a group (a non-finite loss on one side), every member restarts
        from `init(θ, its step key)` — the same fresh task for all, since their keys are equal —
        so the pair never goes on comparing losses of different tasks. Groups that all end at
        once keep their own resets.
        """
        step = lambda th, s, k: self.step(th, s, k, outer_state=outer_state, data=data)
        th_axis = 0 if theta_batched else None
        states, out = jax.vmap(step, in_axes=(th_axis, 0, 0))(thetas, states, keys)
        if reset_groups == 1:
            return states, out
        done = group_any(out.is_done, reset_groups)
        split = done & ~group_all(out.is_done, reset_groups)

        def restart(s):
            fresh = jax.vmap(lambda th, k: self.init(th, k, outer_state=outer_state, data=data),
                             in_axes=(th_axis, 0))(thetas, keys)
            return tree_where(split, fresh, s)

        return jax.lax.cond(jnp.any(split), restart, lambda s: s, states), out.replace(is_done=done)

    def data_args(self) -> Any:
        """Arrays to pass into jit as `data=` (None if the step reads no data)."""
        return None


def group_any(x: jax.Array, groups: int) -> jax.Array:
    """x [P] bool -> [P]: entry i is any(x[j]) over j ≡ i (mod P/groups)."""
    return jnp.tile(jnp.any(x.reshape(groups, -1), axis=0), groups)


def group_all(x: jax.Array, groups: int) -> jax.Array:
    """x [P] bool -> [P]: entry i is all(x[j]) over j ≡ i (mod P/groups)."""
    return jnp.tile(jnp.all(x.reshape(groups, -1), axis=0), groups)


"""Truncation schedules: how long each inner episode runs before the particle resets.

    trunc_state = sched.init(key, outer_state)                       # holds the episode length
    trunc_state, is_done = sched.next_state(trunc_state, step, key, outer_state)

`step` is the number of inner steps taken in the current episode; when it reaches the
length the episode is done and a fresh length is drawn. `done(trunc_state, step)` is the same
test without drawing (a step that resets re-initialises its truncation state anyway). Schedules are frozen dataclasses,
hashable by value.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

import jax
import jax.numpy as jnp
from flax import struct

NEVER = 2**31 - 1


@struct.dataclass
class TruncationState:
    length: jax.Array  # int32 []: inner steps in this episode


class TruncationSchedule:
    def init(self, key: jax.Array, outer_state: Optional[Any] = None) -> TruncationState:
        raise NotImplementedError

    def done(self, trunc_state: TruncationState, step: jax.Array, outer_state: Optional[Any] = None) -> jax.Array:
        """Whether an episode with `trunc_state` is over after `step` inner steps (no randomness)."""
        del outer_state
        return step >= trunc_state.length

    def next_state(self, trunc_state: TruncationState, step: jax.Array, key: jax.Array,
                   outer_state: Optional[Any] = None) -> tuple[TruncationState, jax.Array]:
        is_done = self.done(trunc_state, step, outer_state)
        fresh = self.init(key, outer_state)
        new = jax.tree_util.tree_map(lambda a, b: jnp.where(is_done, a, b), fresh, trunc_state)
        return new, is_done


@dataclasses.dataclass(frozen=True)
class ConstantTruncationSchedule(TruncationSchedule):
    """Every episode is `length` inner steps."""

    length: int

    def __post_init__(self):
        if self.length < 1:
            raise ValueError(f"ConstantTruncationSchedule length must be >= 1, got {self.length}")

    def init(self, key, outer_state=None):
        del key, outer_state
        return TruncationState(length=jnp.asarray(self.length, jnp.int32))


@dataclasses.dataclass(frozen=True)
class LogUniformTruncationSchedule(TruncationSchedule):
    """Episode lengths drawn log-uniformly from [min_length, max_length] (integers)."""

    min_length: int
    max_length: int

    def __post_init__(self):
        if not 1 <= self.min_length <= self.max_length:
            raise ValueError(f"need 1 <= min_length <= max_length, got {self.min_length}, {self.max_length}")

    def init(self, key, outer_state=None):
        del outer_state
        u = jax.random.uniform(key, (), jnp.float32, math.log(self.min_length), math.log(self.max_length + 1))
        length = jnp.clip(jnp.floor(jnp.exp(u)), self.min_length, self.max_length)
        return TruncationState(length=length.astype(jnp.int32))


@dataclasses.dataclass(frozen=True)
class NeverEndingTruncationSchedule(TruncationSchedule):
    """One episode that never ends (online problems); is_done is always False."""

    def init(self, key, outer_state=None):
        del key, outer_state
        return TruncationState(length=jnp.asarray(NEVER, jnp.int32))

    def done(self, trunc_state, step, outer_state=None):
        del trunc_state, step, outer_state
        return jnp.zeros((), bool)

    def next_state(self, trunc_state, step, key, outer_state=None):
        del key
        return trunc_state, self.done(trunc_state, step, outer_state)

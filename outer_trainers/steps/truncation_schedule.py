"""Truncation schedules: how long each inner episode runs before the particle resets.

    trunc_state = sched.init(key, outer_state)                       # holds the episode length
    trunc_state, is_done = sched.next_state(trunc_state, step, key, outer_state)

`step` is the number of inner steps taken in the current episode; when it reaches the
length the episode is done and a fresh length is drawn. `done(trunc_state, step)` is the same
test without drawing (a step that resets re-initialises its truncation state anyway).
`max_length` is the longest episode a schedule can produce (None: unbounded, or episodes never
end). Schedules are frozen dataclasses, hashable by value.
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
    """The per-particle state of a truncation schedule.

    Attributes:
        length: int32 [], the number of inner steps of the current episode.
    """

    length: jax.Array


class TruncationSchedule:
    """Base class of truncation schedules: subclasses implement `init`.

    Attributes:
        max_length: Optional[int], the longest episode the schedule can produce; None when
            episodes are unbounded or never end. Estimators that unroll whole episodes (FullES,
            FullGrad) read it, through `TruncatedStep.max_episode_length`, as their default length.
    """

    max_length: Optional[int] = None

    def init(self, key: jax.Array, outer_state: Optional[Any] = None) -> TruncationState:
        """The truncation state of a fresh episode (its length drawn with `key`).

        Args:
            key: PRNG key for random lengths.
            outer_state: the outer iteration (for curricula) or None; may be ignored.

        Returns:
            A TruncationState.
        """
        raise NotImplementedError

    def done(self, trunc_state: TruncationState, step: jax.Array, outer_state: Optional[Any] = None) -> jax.Array:
        """Whether an episode with `trunc_state` is over after `step` inner steps (no randomness).

        Args:
            trunc_state: the episode's TruncationState.
            step: int32 [], inner steps taken in the episode.
            outer_state: the outer iteration or None; may be ignored.

        Returns:
            bool [].
        """
        del outer_state
        return step >= trunc_state.length

    def next_state(self, trunc_state: TruncationState, step: jax.Array, key: jax.Array,
                   outer_state: Optional[Any] = None) -> tuple[TruncationState, jax.Array]:
        """`done` plus the state of the next step: a fresh `init(key)` if the episode is over.

        Args:
            trunc_state: the episode's TruncationState.
            step: int32 [], inner steps taken in the episode.
            key: PRNG key for the fresh state.
            outer_state: the outer iteration or None; may be ignored.

        Returns:
            (trunc_state, is_done): the state to continue with and bool [].
        """
        is_done = self.done(trunc_state, step, outer_state)
        fresh = self.init(key, outer_state)
        new = jax.tree_util.tree_map(lambda a, b: jnp.where(is_done, a, b), fresh, trunc_state)
        return new, is_done


def _check_lengths(min_length: int, max_length: int) -> None:
    """Raises ValueError unless 1 <= min_length <= max_length (the random-length schedules' bounds)."""
    if not 1 <= min_length <= max_length:
        raise ValueError(f"need 1 <= min_length <= max_length, got {min_length}, {max_length}")


@dataclasses.dataclass(frozen=True)
class ConstantTruncationSchedule(TruncationSchedule):
    """Every episode is `length` inner steps.

    Args:
        length: inner steps per episode, >= 1 (also `max_length`).
    """

    length: int

    def __post_init__(self):
        if self.length < 1:
            raise ValueError(f"ConstantTruncationSchedule length must be >= 1, got {self.length}")

    @property
    def max_length(self) -> int:
        """`length`: every episode is the longest."""
        return self.length

    def init(self, key, outer_state=None):
        del key, outer_state
        return TruncationState(length=jnp.asarray(self.length, jnp.int32))


@dataclasses.dataclass(frozen=True)
class LogUniformTruncationSchedule(TruncationSchedule):
    """Episode lengths drawn log-uniformly from the integers in [min_length, max_length].

    length = clip(⌊exp(u)⌋, min_length, max_length),  u ~ U[log min_length, log(max_length + 1)).

    Args:
        min_length: the shortest episode, >= 1.
        max_length: the longest episode, >= min_length.
    """

    min_length: int
    # field() keeps the argument required: a plain annotation would inherit the base's None as default
    max_length: int = dataclasses.field()

    def __post_init__(self):
        _check_lengths(self.min_length, self.max_length)

    def init(self, key, outer_state=None):
        del outer_state
        u = jax.random.uniform(key, (), jnp.float32, math.log(self.min_length), math.log(self.max_length + 1))
        length = jnp.clip(jnp.floor(jnp.exp(u)), self.min_length, self.max_length)
        return TruncationState(length=length.astype(jnp.int32))


@dataclasses.dataclass(frozen=True)
class PowerLawTruncationSchedule(TruncationSchedule):
    """Episode lengths drawn with density ∝ L^(−`power`) on [min_length, max_length].

    A particle spends inner steps in an episode in proportion to its length L, so the share of
    meta-training (of truncations, hence of outer gradient) spent in episodes of lengths in
    [a, b] is ∝ ∫ L · L^(−power) dL. With power = 1 (log-uniform lengths, as
    `LogUniformTruncationSchedule`) that share grows linearly with the lengths, and the longest
    episodes dominate; with power = 2 every octave of lengths gets the same share of inner steps.

    Sampled by inverting the CDF, with c = 1 − power, a = min_length, b = max_length + 1 and
    u ~ U[0, 1):

        L = ⌊(a^c + u (b^c − a^c))^(1/c)⌋        (power ≠ 1)

    clipped to [min_length, max_length]; power = 1 draws exactly as `LogUniformTruncationSchedule`.

    Args:
        min_length: the shortest episode, >= 1.
        max_length: the longest episode, >= min_length.
        power: the exponent of the length density, >= 0 (0: uniform lengths; 1: log-uniform;
            2: equal inner steps per octave of lengths).
    """

    min_length: int
    max_length: int = dataclasses.field()
    power: float = dataclasses.field()

    def __post_init__(self):
        _check_lengths(self.min_length, self.max_length)
        if not (math.isfinite(self.power) and self.power >= 0):
            raise ValueError(f"power must be finite and >= 0, got {self.power}")

    def init(self, key, outer_state=None):
        if self.power == 1:
            return LogUniformTruncationSchedule(self.min_length, self.max_length).init(key, outer_state)
        del outer_state
        u = jax.random.uniform(key, (), jnp.float32)
        a, b, c = float(self.min_length), float(self.max_length + 1), 1.0 - self.power
        length = (a ** c + u * (b ** c - a ** c)) ** (1.0 / c)
        length = jnp.clip(jnp.floor(length), self.min_length, self.max_length)
        return TruncationState(length=length.astype(jnp.int32))


@dataclasses.dataclass(frozen=True)
class NeverEndingTruncationSchedule(TruncationSchedule):
    """One episode that never ends (online problems): `done` is always False, `max_length` None."""

    def init(self, key, outer_state=None):
        del key, outer_state
        return TruncationState(length=jnp.asarray(NEVER, jnp.int32))

    def done(self, trunc_state, step, outer_state=None):
        del trunc_state, step, outer_state
        return jnp.zeros((), bool)

    def next_state(self, trunc_state, step, key, outer_state=None):
        del key
        return trunc_state, self.done(trunc_state, step, outer_state)

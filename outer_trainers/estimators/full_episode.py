"""What the whole-episode estimators (FullES, FullGrad) share: how far they unroll, the episode meta-loss.

A particle starts a fresh episode and runs until its first `is_done` or `unroll_length` steps,
whichever comes first; steps after that are ignored. Over its counted steps t (those whose
loss counts, m_t) its meta-loss is

    avg:   L = Σ_t m_t ℓ_t / max(Σ_t m_t, 1)        last:  L = ℓ of the last counted step.

`unroll_length` defaults to the truncated step's `max_episode_length`.
"""
from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
from flax import struct

from outer_trainers.validation import check_int
from outer_trainers.steps.truncated_step import StepOut, TruncatedStep

LOSS_TYPES = ("avg", "last")


def episode_unroll_length(truncated_step: TruncatedStep, unroll_length: Optional[int]) -> int:
    """How many steps a whole-episode estimator unrolls.

    Args:
        truncated_step: the TruncatedStep.
        unroll_length: the requested length (>= 1), or None for `truncated_step.max_episode_length`.

    Returns:
        The length, an int >= 1.

    Raises:
        ValueError: `unroll_length` is < 1 or not a whole number, or None while the step's episode
            length is unknown.
    """
    if unroll_length is not None:
        return check_int("unroll_length", unroll_length, minimum=1)
    length = truncated_step.max_episode_length
    if length is None:
        raise ValueError(f"cannot tell how many steps to unroll {type(truncated_step).__name__} "
                         f"({truncated_step.name}): its max_episode_length is None (episodes that never end, or "
                         f"of unknown length); pass unroll_length=")
    return int(length)


@struct.dataclass
class EpisodeLoss:
    """Running meta-loss of particles' first episodes, updated step by step.

    Attributes:
        active: bool [...], whether the episode is still running.
        loss_sum: float32 [...], Σ of the counted step losses.
        count: float32 [...], the number of counted steps.
        last: float32 [...], the last counted step's loss.
        nonfinite: int32 [...], the steps of the episode whose loss was masked out.
        steps: int32 [...], the steps of the episode run so far (counted or not).
    """

    active: jax.Array
    loss_sum: jax.Array
    count: jax.Array
    last: jax.Array
    nonfinite: jax.Array
    steps: jax.Array

    @classmethod
    def zeros(cls, shape: tuple) -> EpisodeLoss:
        """Fresh episodes: active, nothing summed or counted yet.

        Args:
            shape: the particles' batch shape (() for one).

        Returns:
            The EpisodeLoss, leaves of batch shape `shape`.
        """
        zeros, int_zeros = jnp.zeros(shape, jnp.float32), jnp.zeros(shape, jnp.int32)
        return cls(jnp.ones(shape, bool), zeros, zeros, zeros, int_zeros, int_zeros)

    def add(self, t: jax.Array, unroll_length: int, out: StepOut, counts: jax.Array) -> EpisodeLoss:
        """Adds step t's output (ignored once the episode has ended or t >= unroll_length).

        Args:
            t: int32 [], the step's index in the unroll.
            unroll_length: the steps the unroll may run.
            out: the step's StepOut, leaves of batch shape.
            counts: bool, of batch shape, which of the step's losses count (e.g. `out.mask`).

        Returns:
            The updated EpisodeLoss.
        """
        act = self.active & (t < unroll_length)
        use = act & counts
        loss = jnp.where(use, out.loss, 0.0)
        return EpisodeLoss(act & ~out.is_done, self.loss_sum + loss, self.count + use,
                           jnp.where(use, out.loss, self.last), self.nonfinite + (act & ~out.mask), self.steps + act)

    def meta_loss(self, loss_type: str) -> jax.Array:
        """The episode's meta-loss L (see the module docstring).

        Args:
            loss_type: "avg" (the mean of the counted steps' losses) or "last" (the last counted loss).

        Returns:
            float32 of batch shape.
        """
        return self.loss_sum / jnp.maximum(self.count, 1.0) if loss_type == "avg" else self.last

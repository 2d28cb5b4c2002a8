"""The prior schedule a learned step size multiplies: constant, or warm-up + cosine over the horizon.

    σ(t, N) = 1                                                         "constant", or N unknown
    σ(t, N) = min((t+1)/w, 1) · ½(1 + cos(π·min(t/N, 1)))              "cosine", w = max(1, ⌈0.05 N⌉)

A learned step-size head multiplies σ, so what meta-training learns is a correction to a
schedule that already decays to 0 at the end of training, not the schedule itself.
"""
from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp
import optax

from lopt.rules.scaled import StepScaleRule, scale_updates

SCHEDULES = ("constant", "cosine")
WARMUP_FRACTION = 0.05


def check_schedule(name: str) -> None:
    """Refuses an unknown schedule name.

    Args:
      name: a schedule name.

    Raises:
      ValueError: `name` is not one of `SCHEDULES`.
    """
    if name not in SCHEDULES:
        raise ValueError(f"unknown schedule {name!r}; known: {SCHEDULES}")


def prior_schedule(name: str, iteration: jax.Array, num_steps: Optional[Any]) -> jax.Array:
    """σ(t, N), a fixed schedule over the horizon that a learned step size multiplies.

    Args:
      name: "constant" or "cosine" (`SCHEDULES`).
      iteration: t, int32 [] (the number of updates before this one).
      num_steps: the horizon N (may be traced) or None.

    Returns:
      float32 []: 1 for "constant" or N None; for "cosine", min((t+1)/w, 1) · ½(1 + cos(π·min(t/N, 1)))
      with w = max(1, ⌈`WARMUP_FRACTION` · N⌉).
    """
    check_schedule(name)
    if name == "constant" or num_steps is None:
        return jnp.ones((), jnp.float32)
    n = jnp.maximum(jnp.asarray(num_steps, jnp.float32), 1.0)
    t = jnp.asarray(iteration, jnp.float32)
    warm = jnp.minimum((t + 1.0) / jnp.maximum(1.0, jnp.ceil(WARMUP_FRACTION * n)), 1.0)
    return warm * 0.5 * (1.0 + jnp.cos(jnp.pi * jnp.minimum(t / n, 1.0)))


def scheduled(inner: optax.GradientTransformation, num_steps: Any,
              name: str = "cosine") -> optax.GradientTransformationExtraArgs:
    """`inner` with its updates times σ(t, N) (module docstring): the schedule over the horizon as a rule.

    Example: `lopt.rules.scheduled(optax.adamw(1e-3), num_steps=1000)` is AdamW with a 5% linear
    warm-up and a cosine decay to 0 at step 1000. Around a learned update that takes
    `lopt.rules.per_tensor`'s interface (`lopt.Celo2LOpt`'s) σ multiplies each tensor's step size η
    instead, as its learned step-size head's prior schedule.

    Args:
      inner: any optax transform.
      num_steps: the horizon N (an int, or a scalar array that may be traced; None: σ = 1).
      name: "constant" or "cosine" (`SCHEDULES`).

    Returns:
      An `optax.GradientTransformationExtraArgs` (state: `lopt.rules.scaled.ScaledState`).
    """
    check_schedule(name)
    factor = lambda count, params: prior_schedule(name, count, num_steps)
    return scale_updates(inner, factor, lambda count, params: _every_tensor(factor(count, params)))


def _every_tensor(value: Any) -> StepScaleRule:
    """The `StepScaleRule` that puts `value` on every tensor's step size."""
    return StepScaleRule(lambda role, shape: value)

"""The horizon rule: a step-size factor for training runs longer than the meta-trained ones.

    h(N) = min(1, N_ref / N)^α          (1 when N_ref = 0 or N is unknown)
"""
from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp
import optax

from lopt.rules.scaled import scale_updates


def check_horizon_options(reference: Any, **powers: float) -> None:
    """Refuses a horizon reference that is not an int ≥ 0, or a negative power.

    Args:
      reference: N_ref (the option `horizon_reference`).
      **powers: the exponents that go with it, by option name.

    Raises:
      ValueError: naming the options and their values.
    """
    if not (isinstance(reference, int) and reference >= 0 and all(p >= 0 for p in powers.values())):
        got = ", ".join(f"{k}={v!r}" for k, v in {"horizon_reference": reference, **powers}.items())
        raise ValueError(f"horizon_reference must be an int >= 0 and {' and '.join(powers)} >= 0, got {got}")


def horizon_scale(num_steps: Optional[Any], reference: int, power: float) -> jax.Array:
    """min(1, N_ref/N)^α: a step-size factor for horizons beyond a reference horizon.

    The optimal constant step size of a fixed-horizon run shrinks as the horizon grows (for
    convex Lipschitz losses η* ∝ 1/√N, α = ½); a learned step-size head meta-trained on horizons
    up to some N_max sees nothing of that beyond N_max. This factor is 1 up to N_ref and falls as
    a power of N past it, so a learned schedule keeps its meta-trained values on the horizons it
    was trained on and extrapolates by a fixed law past them.

    Args:
      num_steps: the horizon N (may be traced) or None.
      reference: N_ref ≥ 0; 0 turns the factor off.
      power: α ≥ 0.

    Returns:
      float32 []: min(1, N_ref/N)^α; 1 when `reference` is 0 or N is None.
    """
    if reference == 0 or num_steps is None:
        return jnp.ones((), jnp.float32)
    n = jnp.maximum(jnp.asarray(num_steps, jnp.float32), 1.0)
    return jnp.minimum(1.0, reference / n) ** power


def horizon_scaled(inner: optax.GradientTransformation, num_steps: Any, reference: int,
                   power: float = 1.0) -> optax.GradientTransformationExtraArgs:
    """`inner` with its updates times min(1, N_ref/N)^α (`horizon_scale`): horizon scaling as a rule.

    Example: `lopt.rules.horizon_scaled(optax.adamw(1e-3), num_steps=8000, reference=2000)` steps
    at a quarter of AdamW's (a run 4× longer than the reference).

    Args:
      inner: any optax transform.
      num_steps: the horizon N (an int, or a scalar array that may be traced; None: factor 1).
      reference: N_ref, an int ≥ 0 (0: off).
      power: α ≥ 0.

    Returns:
      An `optax.GradientTransformationExtraArgs` (state: `lopt.rules.scaled.ScaledState`).
    """
    check_horizon_options(reference, horizon_power=power)
    return scale_updates(inner, lambda count, params: horizon_scale(num_steps, reference, power))

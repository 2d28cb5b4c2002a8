"""The horizon rule: a step-size factor for training runs longer than the meta-trained ones.

    h(N) = min(1, N_ref / N)^α          (1 when N_ref = 0 or N is unknown)

Around a learned update (`lopt.rules.per_tensor`) h multiplies each tensor's step size η, and with
β = `residual_power` > 0 the learned residual r of the update's direction also fades,

    r ← min(1, N_ref / N)^β · r

so that past N_ref the direction returns towards the one a fresh theta gives (Celo2LOpt's: Muon's),
which is what the learned direction was meta-trained to improve on shorter runs.
"""
from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp
import optax

from lopt.rules import per_tensor

from lopt.rules.scaled import StepScaleRule, known, scale_updates


def check_horizon_options(reference: Any, **powers: float) -> None:
    """Refuses a horizon reference that is not an int ≥ 0, or a negative power.

    Args:
      reference: N_ref (the option `horizon_reference`).
      **powers: the exponents that go with it, by option name.

    Raises:
      ValueError: naming the options and their values.
    """
    if not (isinstance(reference, int) and reference >= 0 and all(p >= 0 for p in powers.values() if known(p))):
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
                   power: float = 1.0, residual_power: float = 0.0) -> optax.GradientTransformationExtraArgs:
    """`inner` with its updates times min(1, N_ref/N)^α (`horizon_scale`): horizon scaling as a rule.

    Example: `lopt.rules.horizon_scaled(optax.adamw(1e-3), num_steps=8000, reference=2000)` steps
    at a quarter of AdamW's (a run 4× longer than the reference). Around a learned update that takes
    `lopt.rules.per_tensor`'s interface (`lopt.Celo2LOpt`'s) the factor multiplies each tensor's step
    size η, and `residual_power` β > 0 fades its learned residual by min(1, N_ref/N)^β (module
    docstring; `celo2_v4` to `celo2_v9` deploy α = 1, β = 2, N_ref = 2000).

    Args:
      inner: any optax transform.
      num_steps: the horizon N (an int, or a scalar array that may be traced; None: factor 1).
      reference: N_ref, an int ≥ 0 (0: off).
      power: α ≥ 0.
      residual_power: β ≥ 0 (0: the residual unscaled); > 0 needs a learned update with the interface.

    Returns:
      An `optax.GradientTransformationExtraArgs` (state: `lopt.rules.scaled.ScaledState`).

    Raises:
      ValueError: a constant out of range, or `residual_power` > 0 around a transform without a learned residual.
    """
    check_horizon_options(reference, horizon_power=power, residual_horizon_power=residual_power)
    fades = not known(residual_power) or residual_power > 0
    if fades and not per_tensor.supports(optax.with_extra_args_support(inner)):
        raise ValueError("horizon_scaled(residual_power > 0) fades a learned update's residual "
                         "(lopt.rules.per_tensor); this transform has none: leave residual_power at 0")
    factor = lambda count, params: horizon_scale(num_steps, reference, power)

    def inside(count, params):
        h = factor(count, params)
        fade = horizon_scale(num_steps, reference, residual_power) if fades and reference > 0 else None
        return StepScaleRule(lambda role, shape: h, fade)

    return scale_updates(inner, factor, inside)

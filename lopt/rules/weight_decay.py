"""The weight-decay rule: decoupled weight decay added to a learned update, at a fixed or learned rate.

    Δp ← Δp − η(p) · λ · p          for every p whose role's kind is in `roles` (default: "matrix")
    λ  = λ₀                                        fixed (`learned` False)
    λ  = λ₀ · exp(R · tanh(s))                     learned: s = theta["weight_decay"]["s"], float32 [], 0 at init

η(p) is the step size the architecture applies to p's own update in that step: for Celo2LOpt
η_matrix for an orthogonalized matrix and η_adam for a tensor on its NAdamW path, each the
learned step-size head's value times the prior schedule σ(t, N) and the horizon and depth
factors. So the decay is AdamW's (Loshchilov & Hutter 2019), p ← p − η_t (u_t + λ p), with the
learned optimizer's step size in the place of AdamW's scheduled rate: it follows the schedule
and the learned step size, and it is decoupled, in that λ p enters neither the gradient
features, nor the moments, nor the normalisation or orthogonalisation of the direction u_t.
Under an orthogonalized update of spectral norm η·w per step, a decayed matrix's spectral norm
stays below about w / λ (the fixed point of ‖W‖ ← (1 − ηλ)‖W‖ + ηw), whatever the horizon.

As AdamW is used in practice, only weight matrices decay by default: biases, norm scales and
embeddings (`lopt.param_roles` kinds "vector" and "embedding") keep their values unless
`roles` names them. Learned, λ is one meta-parameter, log-parameterised and bounded like the
step sizes (`lopt.parts.step_size`): a fresh s = 0 decays at exactly λ₀, and no theta moves λ
by more than a factor e^R either way. λ₀ = 0 turns the rule off: no term is added, and the
update is bit-identical to the architecture's without the rule.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp

from lopt.param_roles import KINDS

__all__ = ["THETA_KEY", "DEFAULT_ROLES", "check_weight_decay_options", "theta_init", "decay_rate", "is_decayed"]

THETA_KEY = "weight_decay"
DEFAULT_ROLES = ("matrix",)


def check_weight_decay_options(rate: float, learned: bool, log_range: float, roles: Sequence[str]) -> None:
    """Refuses a negative λ₀, a learned λ at λ₀ = 0, a range R ≤ 0 or an unknown role kind.

    Args:
      rate: λ₀ (the option `wd_rate`; 0: off).
      learned: whether λ is learned (`wd_learned`).
      log_range: R (`wd_log_range`).
      roles: the role kinds that decay (`wd_roles`).

    Raises:
      ValueError: naming the options and their values.
    """
    if not rate >= 0:
        raise ValueError(f"wd_rate must be >= 0 (0: no weight-decay rule), got {rate!r}")
    if learned and rate == 0:
        raise ValueError("wd_learned=True needs wd_rate > 0: the learned rate is wd_rate · exp(R · tanh(s))")
    if not log_range > 0:
        raise ValueError(f"wd_log_range must be > 0, got {log_range!r}")
    unknown = [r for r in roles if r not in KINDS]
    if unknown or not roles:
        raise ValueError(f"wd_roles must be a non-empty tuple of role kinds {KINDS}, got {tuple(roles)!r}")


def theta_init() -> dict:
    """The rule's meta-parameters when λ is learned: {"s": float32 [] = 0} (λ = λ₀ at init)."""
    return {"s": jnp.zeros((), jnp.float32)}


def decay_rate(theta: Any, rate: float, learned: bool, log_range: float) -> Optional[jax.Array]:
    """λ, the decay coefficient of this step (module docstring).

    Args:
      theta: the architecture's theta (read only when `learned`: its `THETA_KEY` entry).
      rate: λ₀ ≥ 0.
      learned: λ = λ₀ · exp(R · tanh(s)) instead of λ₀.
      log_range: R > 0.

    Returns:
      None when λ₀ = 0 (the rule is off: the caller adds nothing); else float32 [] λ.
    """
    if rate == 0:
        return None
    if not learned:
        return jnp.asarray(rate, jnp.float32)
    s = jnp.asarray(theta[THETA_KEY]["s"], jnp.float32)
    return rate * jnp.exp(log_range * jnp.tanh(s))


def is_decayed(role: Any, roles: Sequence[str]) -> bool:
    """Whether a parameter of `role` (a `lopt.param_roles.ParamRole`) decays: its kind is in `roles`."""
    return role.kind in roles

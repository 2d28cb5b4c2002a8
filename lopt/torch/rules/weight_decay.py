"""The weight-decay rule in torch (`lopt.rules.weight_decay`): decoupled decay added to a learned update.

    Δp ← Δp − η(p) · λ · p          for every p whose role's kind is in `roles` (default: "matrix")
    λ  = λ₀  or, learned,  λ₀ · exp(R · tanh(s))      s = theta["weight_decay"]["s"]

η(p) is the step size the rule applies to p's own update; which parameters decay is
`lopt.rules.weight_decay.is_decayed` of their role (pure Python, shared with JAX). Loss-aware
(`wd_loss_power` p > 0), λ also multiplies φ = clip((ℓ_0 / (ρ_free ℓ̄_t))^p, 1, φ_max), ℓ_0 the first loss
given (each parameter's state "loss_start") and ℓ̄_t its loss EMA (`loss_factors`).
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from lopt.rules.weight_decay import THETA_KEY, loss_start_field

__all__ = ["decay_rate", "loss_factors"]


def decay_rate(theta: dict, rate: float, learned: bool, log_range: float, dtype: torch.dtype,
               device: torch.device) -> Optional[torch.Tensor]:
    """λ of this step, as `lopt.rules.weight_decay.decay_rate`: None when λ₀ = 0 (off).

    Args:
      theta: the rule's theta as tensors (`Rule.theta_on`); read only when `learned`.
      rate: λ₀ ≥ 0.
      learned: λ = λ₀ · exp(R · tanh(s)) instead of λ₀.
      log_range: R > 0.
      dtype: the compute dtype.
      device: the compute device.

    Returns:
      None, or a 0-d tensor λ of `dtype` on `device`.
    """
    if rate == 0:
        return None
    if not learned:
        return torch.tensor(rate, dtype=dtype, device=device)
    s = theta[THETA_KEY]["s"].to(dtype=dtype, device=device)
    return rate * torch.exp(log_range * torch.tanh(s))


def loss_factors(states: list, old_loss: torch.Tensor, new_loss: torch.Tensor, loss: Optional[torch.Tensor],
                 power: float, max_factor: float, free: Any = 1.0) -> torch.Tensor:
    """φ per parameter, as `lopt.rules.weight_decay.loss_factor`; each state's ℓ_0 set at its first loss.

    Args:
      states: the parameters' torch states (their "loss_start" entries are read and written).
      old_loss, new_loss: their "loss_state" entries [L, 2] ([ℓ̄, seen]) before and after this step.
      loss: this step's loss (0-d), or None.
      power: p > 0.
      max_factor: φ_max ≥ 1.
      free: ρ_free > 0, a float or [L] per parameter (`lopt.rules.weight_decay.loss_free_of`).

    Returns:
      [L] φ in [1, φ_max], in new_loss's dtype.
    """
    key = loss_start_field().key
    start = torch.stack([st[key] for st in states])
    if loss is not None:
        start = torch.where(old_loss[:, 1] > 0, start, loss.to(start.dtype))
        for i, st in enumerate(states):
            st[key] = start[i]
    ema = new_loss[:, 0]
    valid = (start > 0) & (ema > 0)
    ratio = torch.where(valid, start / torch.where(valid, ema, torch.ones_like(ema)), torch.ones_like(ema))
    return torch.clamp((ratio / free) ** power, 1.0, max_factor)

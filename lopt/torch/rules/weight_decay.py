"""The weight-decay rule in torch (`lopt.rules.weight_decay`): decoupled decay added to a learned update.

    Δp ← Δp − η(p) · λ · p          for every p whose role's kind is in `roles` (default: "matrix")
    λ  = λ₀  or, learned,  λ₀ · exp(R · tanh(s))      s = theta["weight_decay"]["s"]

η(p) is the step size the rule applies to p's own update; which parameters decay is
`lopt.rules.weight_decay.is_decayed` of their role (pure Python, shared with JAX).
"""
from __future__ import annotations

from typing import Optional

import torch

from lopt.rules.weight_decay import THETA_KEY

__all__ = ["decay_rate"]


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

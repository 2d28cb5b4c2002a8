"""The weight-decay rule in torch (`lopt.rules.weight_decay`): decoupled decay added to a learned update.

    Δp ← Δp − η(p) · λ · p          for every p whose role's kind is in `roles` (default: "matrix")
    λ  = λ₀  or, learned,  λ₀ · exp(R · tanh(s))      s = theta["weight_decay"]["s"]

η(p) is the step size the rule applies to p's own update; which parameters decay is
`lopt.rules.weight_decay.is_decayed` of their role (pure Python, shared with JAX). Loss-aware
(`wd_loss_power` p > 0), λ also multiplies φ = clip((ℓ_0 / (ρ_free ℓ̄_t))^p, 1, φ_max), ℓ_0 the first loss
given (each parameter's state "loss_start") and ℓ̄_t its loss EMA (`loss_factors`).
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch

from lopt.parts.features import LOSS_DECAY
from lopt.rules.weight_decay import (DEFAULT_ROLES, THETA_KEY, check_loss_options, check_weight_decay_options,
                                     is_decayed, loss_free_of, loss_start_field)
from lopt.torch.rules.scaled import RuleOptimizer, param_role

__all__ = ["decay_rate", "loss_factors", "LossAwareDecay", "loss_aware_decay"]


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


class LossAwareDecay(RuleOptimizer):
    """`loss_aware_decay`'s optimizer: the wrapped step plus −η_t · λ₀ · φ_t · p on the decayed roles.

    Args:
      inner: the wrapped optimizer.
      learning_rate: η, a float or a callable of the update count t.
      rate: λ₀ > 0.
      loss_power: p ≥ 0.
      loss_max: φ_max ≥ 1.
      loss_free: ρ_free > 0.
      conv_loss_free: conv kernels' ρ_free (0: `loss_free`).
      roles: the role kinds that decay.
      role: None, or a callable param -> role kind (`lopt.torch.rules.scaled`).
    """

    def __init__(self, inner, learning_rate, rate, loss_power, loss_max, loss_free, conv_loss_free, roles,
                 role: Optional[Callable] = None):
        super().__init__(inner, role)
        self.learning_rate, self.rate, self.roles = learning_rate, float(rate), tuple(roles)
        self.loss_power, self.loss_max, self.loss_free, self.conv_loss_free = loss_power, loss_max, loss_free, conv_loss_free
        self.loss_state = torch.zeros(2, dtype=torch.float32)  # [ℓ̄, seen], as lopt.parts.features.loss_features
        self.loss_start = torch.zeros((), dtype=torch.float32)

    def rule(self, steps, before, params, loss):
        old = self.loss_state
        if loss is not None:
            ema = torch.where(old[1] > 0, old[0], loss)
            self.loss_state = torch.stack([LOSS_DECAY * ema + (1.0 - LOSS_DECAY) * loss, torch.ones((), dtype=torch.float32)])
            self.loss_start = torch.where(old[1] > 0, self.loss_start, loss)
        eta = self.learning_rate(self.count) if callable(self.learning_rate) else self.learning_rate
        out = []
        for s, b, p in zip(steps, before, params):
            r = param_role(p, self.role)[0]
            if is_decayed(r, self.roles):
                lam = torch.tensor(self.rate, dtype=torch.float32)
                if self.loss_power > 0:
                    free = loss_free_of(r, self.loss_free, self.conv_loss_free)
                    valid = (self.loss_start > 0) & (self.loss_state[0] > 0)
                    ratio = torch.where(valid, self.loss_start / torch.where(valid, self.loss_state[0], 1.0), 1.0)
                    lam = lam * torch.clamp((ratio / free) ** self.loss_power, 1.0, self.loss_max)
                s = s - eta * lam.to(s.device) * b
            out.append(s)
        return out

    def rule_state(self) -> dict:
        return {"loss_state": self.loss_state.clone(), "loss_start": self.loss_start.clone()}

    def load_rule_state(self, state: dict) -> None:
        self.loss_state, self.loss_start = state["loss_state"].clone(), state["loss_start"].clone()


def loss_aware_decay(inner: torch.optim.Optimizer, learning_rate: Any, rate: float, *, loss_power: float = 1.0,
                     loss_max: float = 10.0, loss_free: float = 1.0, conv_loss_free: float = 0.0,
                     roles: Sequence[str] = DEFAULT_ROLES, role: Optional[Callable] = None) -> LossAwareDecay:
    """`inner` plus decoupled weight decay whose rate grows as the training loss falls
    (`lopt.rules.weight_decay.loss_aware_decay`; pass the loss: `step(closure)` or `step(loss=...)`).

    Args:
      inner: any torch optimizer.
      learning_rate: η, a float or a callable of the update count t.
      rate: λ₀ > 0.
      loss_power: p ≥ 0 (0: a fixed rate).
      loss_max: φ_max ≥ 1.
      loss_free: ρ_free > 0.
      conv_loss_free: conv kernels' ρ_free (0: `loss_free`).
      roles: the role kinds that decay (default weight matrices).
      role: None, or a callable param -> role kind (`lopt.torch.rules.scaled`).

    Returns:
      a `LossAwareDecay`.
    """
    check_weight_decay_options(rate, False, 1.0, tuple(roles))
    check_loss_options(rate, loss_power, loss_max, loss_free, conv_loss_free)
    if rate == 0:
        raise ValueError("loss_aware_decay needs rate > 0 (without a decay, use the optimizer itself)")
    return LossAwareDecay(inner, learning_rate, rate, loss_power, loss_max, loss_free, conv_loss_free, roles, role)

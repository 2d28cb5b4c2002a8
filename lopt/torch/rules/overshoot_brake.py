"""`lopt.rules.overshoot_brake` in torch: every step scaled by α_t ∈ [floor, 1], over all parameters.

    c_t     = ⟨g_t, Δp_{t−1}⟩ / (‖g_t‖ ‖Δp_{t−1}‖)   over every parameter stepped (0 while Δp_{t−1} = 0)
    log α_t = clip(log α_{t−1} − κ (c_t − c₀), log floor, 0)
    Δp_t    = α_t · (the rule's Δp_t, cast to the parameter's dtype), in float32, cast back

As in JAX, g_t and Δp_{t−1} are float32 whatever the parameter's dtype, the three sums run over
the parameters in order, and log α_t is computed before the rule's update. The state is per
parameter "prev_update" (float32 [*p.shape], Δp_{t−1}) and, once per optimizer, log α
(`TorchLearnedOptimizer` keeps it in `optimizer.state[BRAKE_KEY]`, so that it round-trips through
`state_dict`). Parameters without a gradient this step take no part (their Δp_{t−1} is kept).
"""
from __future__ import annotations

import math
from typing import Sequence

import torch

from lopt.rules.overshoot_brake import FLOOR

__all__ = ["OvershootBrake", "BRAKE_KEY"]

#: the optimizer-level entry of `TorchLearnedOptimizer.state` holding {"log_brake": float32 []}
BRAKE_KEY = "overshoot_brake"


class OvershootBrake:
    """The brake of one optimizer (`lopt.rules.overshoot_brake.overshoot_brake(inner, gain, threshold, floor)`).

    Args:
      gain: κ > 0.
      threshold: c₀ in [0, 1).
      floor: the smallest α.
    """

    def __init__(self, gain: float, threshold: float, floor: float = FLOOR):
        self.gain, self.threshold, self.floor = float(gain), float(threshold), float(floor)

    @staticmethod
    def init_param_state(param: torch.Tensor) -> dict:
        """The per-parameter state: {"prev_update": float32 zeros like param}."""
        return {"prev_update": torch.zeros(param.shape, dtype=torch.float32, device=param.device)}

    @staticmethod
    def init_state() -> dict:
        """The optimizer-level state: {"log_brake": float32 [] zero} (on the CPU)."""
        return {"log_brake": torch.zeros((), dtype=torch.float32)}

    def advance(self, state: dict, grads: Sequence[torch.Tensor], prevs: Sequence[torch.Tensor]) -> torch.Tensor:
        """log α_t from log α_{t−1} (state["log_brake"], replaced), g_t and Δp_{t−1}; returns α_t.

        Args:
          state: the optimizer-level state.
          grads: g_t per parameter (any float dtype; read as float32).
          prevs: Δp_{t−1} per parameter (float32, same shapes).

        Returns:
          α_t = exp(log α_t), float32 [] on the CPU.
        """
        zero = torch.zeros((), dtype=torch.float32)
        dot, gg, dd = zero, zero, zero
        for g, d in zip(grads, prevs):
            g32 = g.detach().to(torch.float32).reshape(-1)
            d = d.reshape(-1)
            dot = dot + torch.dot(g32, d).cpu()
            gg = gg + torch.dot(g32, g32).cpu()
            dd = dd + torch.dot(d, d).cpu()
        cos = torch.where(dd > 0, dot * torch.rsqrt(torch.clamp(gg * dd, min=1e-37)), zero)
        log_brake = torch.clamp(state["log_brake"] - self.gain * (cos - self.threshold), math.log(self.floor), 0.0)
        state["log_brake"] = log_brake
        return torch.exp(log_brake)

    @staticmethod
    def apply(param_state: dict, update: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
        """α · update (update in the parameter's dtype), kept as the parameter's Δp_{t−1}.

        Args:
          param_state: the parameter's state (its "prev_update" is replaced).
          update: the rule's Δp_t cast to the parameter's dtype.
          alpha: α_t.

        Returns:
          The braked Δp_t in the parameter's dtype.
        """
        prev = param_state["prev_update"]  # overwritten in place: no fresh tensor per step
        torch.mul(update.to(torch.float32), alpha.to(update.device), out=prev)
        return prev.to(update.dtype)

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
from lopt.torch.rules.scaled import RuleOptimizer

__all__ = ["OvershootBrake", "BRAKE_KEY", "BrakedOptimizer", "overshoot_brake"]

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


class BrakedOptimizer(RuleOptimizer):
    """A torch optimizer whose steps the brake scales (`overshoot_brake`).

    Args:
      inner: the wrapped optimizer.
      brake: the `OvershootBrake`.
    """

    def __init__(self, inner: torch.optim.Optimizer, brake: OvershootBrake):
        super().__init__(inner)
        self.brake, self.brake_state, self.prev, self.alpha = brake, OvershootBrake.init_state(), {}, None

    def before_step(self, params):
        prevs = [self.prev.setdefault(p, OvershootBrake.init_param_state(p)) for p in params]
        self.alpha = self.brake.advance(self.brake_state, [p.grad for p in params], [s["prev_update"] for s in prevs])

    def rule(self, steps, before, params, loss):
        return [OvershootBrake.apply(self.prev[p], s, self.alpha) for p, s in zip(params, steps)]

    def rule_state(self) -> dict:
        params = [p for g in self.inner.param_groups for p in g["params"]]
        return {"log_brake": self.brake_state["log_brake"].clone(),
                "prev_update": [self.prev[p]["prev_update"].clone() if p in self.prev else None for p in params]}

    def load_rule_state(self, state: dict) -> None:
        self.brake_state = {"log_brake": state["log_brake"].clone()}
        params = [p for g in self.inner.param_groups for p in g["params"]]
        self.prev = {p: {"prev_update": d.clone()} for p, d in zip(params, state["prev_update"]) if d is not None}


def overshoot_brake(inner: torch.optim.Optimizer, gain: float, threshold: float = 0.15,
                    floor: float = FLOOR) -> BrakedOptimizer:
    """`inner` with its steps scaled by the overshoot brake's α_t (`lopt.rules.overshoot_brake.overshoot_brake`).

    Args:
      inner: any torch optimizer.
      gain: κ > 0.
      threshold: c₀ in [0, 1).
      floor: the smallest α, in (0, 1].

    Returns:
      a `BrakedOptimizer`.
    """
    if not gain > 0 or not 0 <= threshold < 1 or not 0 < floor <= 1:
        raise ValueError(f"overshoot_brake needs gain > 0, 0 <= threshold < 1 and 0 < floor <= 1, got {gain}, "
                         f"{threshold}, {floor}")
    return BrakedOptimizer(inner, OvershootBrake(gain, threshold, floor))

"""`lopt.rules.radial` in torch: the growth limit, no step may grow a weight matrix past g × LeCun's scale.

    Δp ← Δp − max(0, ⟨Δp, p⟩) / ⟨p, p⟩ · p      on weight matrices with rms(p) · √fan_in > g
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from lopt.rules.radial import EPS
from lopt.torch.rules.scaled import RuleOptimizer, param_role

__all__ = ["remove_growth", "GrowthLimited", "growth_limited"]


def remove_growth(r: torch.Tensor, p: torch.Tensor, free: float = 0.0, fan_in: int = 1) -> torch.Tensor:
    """`lopt.rules.radial.remove_growth` in torch: r without its component that grows ‖p‖ (float32).

    Args:
      r: the residual direction (the step is along −r), float32.
      p: the weight matrix, the same number of elements, float32.
      free: g ≥ 0 (0: wherever ‖p‖ > 0).
      fan_in: the matrix's fan-in.

    Returns:
      r − min(0, ⟨r, p⟩) / ⟨p, p⟩ · p where the rule acts, else r.
    """
    p = p.reshape(r.shape).to(r.dtype)
    inner, sq = torch.sum(r * p), torch.sum(p * p)
    coef = torch.clamp(inner, max=0.0) / (sq + EPS)
    if free > 0:
        coef = torch.where(sq / p.numel() * fan_in > free * free, coef, torch.zeros_like(coef))
    return r - coef * p


class GrowthLimited(RuleOptimizer):
    """The growth limit around a torch optimizer (`growth_limited`).

    Args:
      inner: the wrapped optimizer.
      free: g ≥ 0.
      role: None, or a callable param -> role kind (`lopt.torch.rules.scaled`).
    """

    def __init__(self, inner: torch.optim.Optimizer, free: float, role: Optional[Callable] = None):
        super().__init__(inner, role)
        self.free = float(free)

    def rule(self, steps, before, params, loss):
        out = []
        for s, b, p in zip(steps, before, params):
            r, shape, is_matrix = param_role(p, self.role)
            out.append(-remove_growth(-s, b, self.free, r.fan_in(shape)) if is_matrix else s)
        return out


def growth_limited(inner: torch.optim.Optimizer, free: float = 4.0, *, role: Optional[Callable] = None) -> GrowthLimited:
    """`inner` whose steps may not grow a weight matrix past `free` × LeCun's scale
    (`lopt.rules.radial.growth_limited`).

    Args:
      inner: any torch optimizer.
      free: g ≥ 0.
      role: None, or a callable param -> role kind.

    Returns:
      a `GrowthLimited`.
    """
    if not free >= 0:
        raise ValueError(f"growth_limited needs free >= 0, got {free!r}")
    return GrowthLimited(inner, free, role)

"""AdamW with learned lr and signed weight decay in torch (`lopt.archs.learnable_decay`).

theta holds lr = exp(θ_log_lr) and λ = θ_weight_decay; the update is optax.adamw's:

    m ← (1−β1) g + β1 m,  v ← (1−β2) g² + β2 v,
    Δp = −lr ((m / (1 − β1^k)) / (√(v / (1 − β2^k) + ε_root) + ε) + λ p),  k the update count
"""
from __future__ import annotations

import torch

from lopt.torch.rule import Rule, register

__all__ = ["LearnableAdamWRule"]


@register("LearnableAdamW")
class LearnableAdamWRule(Rule):
    """`lopt.LearnableAdamW`: optax.adamw with learned lr and λ (state "mu", "nu").

    Args:
      learned_opt: the `lopt.LearnableAdamW` (its β1, β2, ε are read from it).
      theta: its meta-parameters (numpy arrays).
    """

    def updates(self, items, ctx):
        lo = self.learned_opt
        neg_lr, wd = -torch.exp(ctx.theta["log_lr"]), ctx.theta["weight_decay"]
        b1, b2 = float(lo.b1), float(lo.b2)
        count = ctx.steps + 1.0
        bc1 = 1.0 - _pow(b1, count, ctx.dtype)
        bc2 = 1.0 - _pow(b2, count, ctx.dtype)
        for i, it in enumerate(items):
            g = it.grad.detach().to(ctx.dtype)
            mu, nu = it.state["mu"], it.state["nu"]
            mu.mul_(b1).add_((1.0 - b1) * g)
            nu.mul_(b2).add_((1.0 - b2) * torch.square(g))
            adam = (mu / bc1[i]) / (torch.sqrt(nu / bc2[i] + float(lo.eps_root)) + float(lo.eps))
            yield neg_lr * (adam + wd * it.param.detach().to(ctx.dtype))


def _pow(base: float, exponent: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """base^exponent (optax's bias correction), float32 powers taken in float64 and rounded."""
    if dtype == torch.float64:
        return torch.pow(torch.as_tensor(base, dtype=dtype, device=exponent.device), exponent)
    return torch.pow(torch.as_tensor(base, dtype=torch.float64, device=exponent.device), exponent.double()).to(dtype)

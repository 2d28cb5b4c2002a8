"""The hand-designed optimizers with learned hyper-parameters in torch (`lopt.archs.learnable_hparams`).

theta holds lr = exp(θ_log_lr), β = σ(θ_logit_β), ε = exp(θ_log_eps); the updates are optax's:

    LearnableSGD:   Δp = −lr g
    LearnableSGDM:  t ← g + μ t,  Δp = −lr t                                  (optax.trace)
    LearnableAdam:  m ← (1−β1) g + β1 m,  v ← (1−β2) g² + β2 v,
                    Δp = −lr (m / (1 − β1^k)) / (√(v / (1 − β2^k)) + ε),  k the update count
"""
from __future__ import annotations

import torch

from lopt.torch.rule import Rule, register

__all__ = ["LearnableSGDRule", "LearnableSGDMRule", "LearnableAdamRule"]


@register("LearnableSGD")
class LearnableSGDRule(Rule):
    """`lopt.LearnableSGD`: Δp = −exp(θ_log_lr) g.

    Args:
      learned_opt: the `lopt.LearnableSGD`.
      theta: its meta-parameters (numpy arrays).
    """

    def updates(self, items, ctx):
        neg_lr = -torch.exp(ctx.theta["log_lr"])
        return [it.grad.detach().to(ctx.dtype) * neg_lr for it in items]


@register("LearnableSGDM")
class LearnableSGDMRule(Rule):
    """`lopt.LearnableSGDM`: t ← g + μ t, Δp = −lr t (state "trace").

    Args:
      learned_opt: the `lopt.LearnableSGDM`.
      theta: its meta-parameters (numpy arrays).
    """

    def updates(self, items, ctx):
        neg_lr = -torch.exp(ctx.theta["log_lr"])
        mom = torch.sigmoid(ctx.theta["logit_momentum"])
        for it in items:
            t = it.state["trace"]
            t.mul_(mom).add_(it.grad.detach().to(ctx.dtype))
            yield t * neg_lr


@register("LearnableAdam")
class LearnableAdamRule(Rule):
    """`lopt.LearnableAdam`: optax.adam with learned lr, β1, β2, ε (state "mu", "nu").

    Args:
      learned_opt: the `lopt.LearnableAdam`.
      theta: its meta-parameters (numpy arrays).
    """

    def updates(self, items, ctx):
        th = ctx.theta
        neg_lr, eps = -torch.exp(th["log_lr"]), torch.exp(th["log_eps"])
        b1, b2 = torch.sigmoid(th["logit_b1"]), torch.sigmoid(th["logit_b2"])
        count = ctx.steps + 1.0
        bc1 = 1.0 - _pow(b1, count, ctx.dtype)
        bc2 = 1.0 - _pow(b2, count, ctx.dtype)
        for i, it in enumerate(items):
            g = it.grad.detach().to(ctx.dtype)
            mu, nu = it.state["mu"], it.state["nu"]
            mu.mul_(b1).add_((1.0 - b1) * g)
            nu.mul_(b2).add_((1.0 - b2) * torch.square(g))
            yield neg_lr * ((mu / bc1[i]) / (torch.sqrt(nu / bc2[i]) + eps))


def _pow(base: torch.Tensor, exponent: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """base^exponent (optax's bias correction), float32 powers taken in float64 and rounded."""
    if dtype == torch.float64:
        return torch.pow(base, exponent)
    return torch.pow(base.double(), exponent.double()).to(dtype)


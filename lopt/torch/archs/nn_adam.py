"""NNAdam's update in torch (`lopt.archs.nn_adam`): Adam whose lr, β1, β2, ε per tensor and step come from an LSTM.

Per tensor i the LSTM reads z_i = [log mean g², log mean m², log mean v, log mean p² (each /10,
before this step's update), log(1 + numel)/10, emb(t), progress(t, N), loss features]; its head
o_i = h_i W + b gives lr_i = lr·e^{o_i0}, β1_i = σ(logit β1 + o_i1), β2_i = σ(logit β2 + o_i2),
ε_i = ε·e^{o_i3}; then Adam, its bias corrections the running products c1 ← c1·β1_i, c2 ← c2·β2_i:

    m ← β1 m + (1−β1) g,  v ← β2 v + (1−β2) g²,  Δp = −lr · (m/(1−c1)) / (√(v/(1−c2)) + ε).
"""
from __future__ import annotations

import math

import torch

from lopt.parts.nn import logit
from lopt.torch.parts.features import lstm_inputs
from lopt.torch.parts.nn import run_lstm
from lopt.torch.rule import Rule, register

__all__ = ["NNAdamRule"]


@register("NNAdam")
class NNAdamRule(Rule):
    """`lopt.NNAdam`'s update (the math is in the module docstring).

    Args:
      learned_opt: the `lopt.NNAdam`.
      theta: its meta-parameters (numpy arrays).
    """

    reads_loss = True

    def updates(self, items, ctx):
        lo, th = self.learned_opt, ctx.theta
        loss_feats = self.loss_features(items, ctx)
        base = torch.tensor([math.log(lo.learning_rate), logit(lo.b1), logit(lo.b2), math.log(lo.eps)],
                            dtype=torch.float32).to(device=ctx.device, dtype=ctx.dtype)
        mean = lambda x: torch.mean(x) if x.numel() else torch.zeros((), dtype=ctx.dtype, device=ctx.device)
        grads = [it.grad.detach().to(ctx.dtype) for it in items]
        stats = torch.stack([torch.stack([s[name] for name in self.spec.features]) for s in (
            {"mean_g2": mean(torch.square(g)), "mean_m2": mean(torch.square(it.state["mu"])),
             "mean_v": mean(it.state["nu"]), "mean_p2": mean(torch.square(it.param.detach().to(ctx.dtype)))}
            for g, it in zip(grads, items))])
        ctx_feats = ctx.context_row(lo.timescales, items, loss_feats)
        h = run_lstm(th["lstm"], lstm_inputs(stats, items, ctx_feats), items)
        hp = base + h @ th["output"]["w"] + th["output"]["b"]
        lr, b1, b2, eps = torch.exp(hp[:, 0]), torch.sigmoid(hp[:, 1]), torch.sigmoid(hp[:, 2]), torch.exp(hp[:, 3])
        for i, (g, it) in enumerate(zip(grads, items)):
            st = it.state
            st["b1_prod"], st["b2_prod"] = st["b1_prod"] * b1[i], st["b2_prod"] * b2[i]
            mu, nu = st["mu"], st["nu"]
            mu.mul_(b1[i]).add_((1.0 - b1[i]) * g)
            nu.mul_(b2[i]).add_((1.0 - b2[i]) * torch.square(g))
            m_hat, v_hat = mu / (1.0 - st["b1_prod"]), nu / (1.0 - st["b2_prod"])
            yield -lr[i] * m_hat / (torch.sqrt(v_hat) + eps[i])

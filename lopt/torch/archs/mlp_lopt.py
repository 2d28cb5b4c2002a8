"""MLPLOpt's update in torch (`lopt.archs.mlp_lopt`).

Per tensor (flat, in the parameter's own element order: every step here is elementwise or a
whole-tensor sum, so the layout does not matter):

    m_k ← β_k m_k + (1 − β_k) g,   v ← β_v v + (1 − β_v) g²      (`lopt.torch.parts.moment_features`)
    x   = [g, p, m_1..m_K, √v, g/√(v+ε), m_0.9/√(v+ε)]
    W1' = diag(1/rms(x_f)) W1                  (the per-tensor RMS folded into the first layer)
    (d, m) = MLP(x; bias b + emb(t) W_time (+ progress(t, N) W_progress))
    Δp  = −d · exp(m · exp_mult) · step_mult

A tensor is walked in blocks (`Item.chunk` elements) twice: once to update its accumulators and
sum its features' squares, once to run the MLP on each block's [F, c] features, so no [n, F]
feature array or [n, H] activation exists.
"""
from __future__ import annotations

import torch

from lopt.torch.parts.moment_features import FlatLeaf
from lopt.torch.parts.nn import as_columns, first_bias
from lopt.torch.rule import Rule, register

__all__ = ["MLPLOptRule"]


@register("MLPLOpt")
class MLPLOptRule(Rule):
    """`lopt.MLPLOpt`'s update (the math is in the module docstring).

    Args:
      learned_opt: the `lopt.MLPLOpt`.
      theta: its meta-parameters (numpy arrays).
    """

    flat_momenta = True

    def updates(self, items, ctx):
        lo, th = self.learned_opt, ctx.theta
        decays = torch.tensor(lo.decays, dtype=ctx.dtype, device=ctx.device)
        bias = first_bias(th["input"], ctx, items, lo.timescales)
        later = as_columns([(th[f"hidden_{i}"]["w"], th[f"hidden_{i}"]["b"]) for i in range(1, lo.hidden_layers)]
                           + [(th["output"]["w"], th["output"]["b"])])
        for i, it in enumerate(items):
            if it.param.numel() == 0:
                yield torch.zeros(it.param.shape, dtype=ctx.dtype, device=ctx.device)
                continue
            leaf = FlatLeaf(it, ctx.dtype, self.spec, lo.momentum_index, self.ws)
            sums = leaf.accumulate_and_sum(decays, lo.rms_decay)
            w1t = (th["input"]["w"] * torch.rsqrt(sums / leaf.n + self.spec.constants["eps"])[:, None]).t().contiguous()
            step = leaf.scaled_exp_step([(w1t, bias[i])] + later, lo.exp_mult, lo.step_mult)
            yield step.neg_().view(it.param.shape)

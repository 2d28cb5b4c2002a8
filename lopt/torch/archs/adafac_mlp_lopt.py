"""AdafacMLPLOpt's update in torch (`lopt.archs.adafac_mlp_lopt`).

Per tensor, the factored accumulators and the F = 4 + 2K_m + 3K_f + K_m K_f features read from
them (decays β = σ(θ_β) learned; row and column moments over the JAX layout's last two axes) are
`lopt.torch.parts.factored.FactoredLeaf`'s. The MLP (on the RMS-normalised features,
first-layer bias b + emb(t) W_time (+ progress)) gives (d, m):

    Δp = −d · exp(m · exp_mult) · step_mult.
"""
from __future__ import annotations

import torch

from lopt.torch.parts.factored import FactoredLeaf, decays_of
from lopt.torch.parts.nn import as_columns, first_bias
from lopt.torch.rule import Rule, register

__all__ = ["AdafacMLPLOptRule"]


@register("AdafacMLPLOpt")
class AdafacMLPLOptRule(Rule):
    """`lopt.AdafacMLPLOpt`'s update (the math is in the module docstring).

    Args:
      learned_opt: the `lopt.AdafacMLPLOpt`.
      theta: its meta-parameters (numpy arrays).
    """

    def updates(self, items, ctx):
        lo, th = self.learned_opt, ctx.theta
        dec = decays_of(th["decays"])
        bias = first_bias(th["input"], ctx, items, lo.timescales)
        rest = as_columns([(th[f"hidden_{i}"]["w"], th[f"hidden_{i}"]["b"]) for i in range(1, lo.hidden_layers)]
                          + [(th["output"]["w"], th["output"]["b"])])
        for i, it in enumerate(items):
            if it.param.numel() == 0:
                yield torch.zeros(it.param.shape, dtype=ctx.dtype, device=ctx.device)
                continue
            leaf = FactoredLeaf(it, ctx.dtype, self.spec, self.ws)
            leaf.accumulate(dec)
            w1t = (th["input"]["w"] * torch.rsqrt(leaf.mean_squares() + self.spec.constants["eps"])[:, None]).t().contiguous()
            yield leaf.scaled_exp_step([(w1t, bias[i])] + rest, lo.exp_mult, lo.step_mult).neg_()

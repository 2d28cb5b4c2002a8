"""RNNMLPLOpt's update in torch (`lopt.archs.rnn_mlp_lopt`).

MLPLOpt's accumulators and features per tensor (`lopt.torch.parts.moment_features.FlatLeaf`); a per-tensor LSTM, its
state (h_i, c_i) kept in each parameter's state ("lstm_h", "lstm_c"), reads

    z_i = [log(mean x_f²)/10 (F), log(1 + numel)/10, emb(t) (T), progress(t, N) (3), loss features (2)]

and conditions the per-parameter MLP: first-layer bias b + h_i W_cond, step multiplier exp(h_i · w_lr):

    Δp = −d · exp(m · exp_mult) · (step_mult · exp(h_i · w_lr)).
"""
from __future__ import annotations

import torch

from lopt.torch.parts.features import lstm_inputs
from lopt.torch.parts.moment_features import FlatLeaf
from lopt.torch.parts.nn import as_columns, run_lstm
from lopt.torch.rule import Rule, register

__all__ = ["RNNMLPLOptRule"]


@register("RNNMLPLOpt")
class RNNMLPLOptRule(Rule):
    """`lopt.RNNMLPLOpt`'s update (the math is in the module docstring).

    Args:
      learned_opt: the `lopt.RNNMLPLOpt`.
      theta: its meta-parameters (numpy arrays).
    """

    flat_momenta = True
    reads_loss = True

    def updates(self, items, ctx):
        lo, th = self.learned_opt, ctx.theta
        loss_feats = self.loss_features(items, ctx)
        decays = torch.tensor(lo.decays, dtype=ctx.dtype, device=ctx.device)
        leaves, stats = [], []
        for it in items:  # phase 1: accumulators and per-tensor statistics
            if it.param.numel() == 0:
                leaves.append(None)
                stats.append(torch.zeros((lo.num_features,), dtype=ctx.dtype, device=ctx.device))
                continue
            leaf = FlatLeaf(it, ctx.dtype, self.spec, lo.momentum_index, self.ws)
            stats.append(leaf.accumulate_and_sum(decays, lo.rms_decay) / leaf.n)
            leaves.append(leaf)
        stats = torch.stack(stats)
        ctx_feats = ctx.context_row(lo.timescales, items, loss_feats)
        h = run_lstm(th["lstm"], lstm_inputs(stats, items, ctx_feats), items)
        cond = h @ th["w_cond"]
        lr_mult = torch.exp(h @ th["w_lr"])
        rest = as_columns([(th[f"hidden_{i}"]["w"], th[f"hidden_{i}"]["b"]) for i in range(1, lo.mlp_layers)]
                          + [(th["output"]["w"], th["output"]["b"])])
        for i, (it, leaf) in enumerate(zip(items, leaves)):  # phase 2: the per-parameter MLP
            if leaf is None:
                yield torch.zeros(it.param.shape, dtype=ctx.dtype, device=ctx.device)
                continue
            w1t = (th["input"]["w"] * torch.rsqrt(stats[i] + self.spec.constants["eps"])[:, None]).t().contiguous()
            step = leaf.scaled_exp_step([(w1t, th["input"]["b"] + cond[i])] + rest, lo.exp_mult,
                                        lo.step_mult * lr_mult[i])
            yield step.neg_().view(it.param.shape)

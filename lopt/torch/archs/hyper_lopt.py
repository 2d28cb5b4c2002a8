"""HyperLOpt's update in torch (`lopt.archs.hyper_lopt`): a per-tensor LSTM generating each tensor's MLP.

AdafacMLPLOpt's accumulators and features per tensor (`lopt.torch.parts.factored.FactoredLeaf`,
factored over the JAX layout's last two axes). The LSTM (state "lstm_h", "lstm_c" per parameter)
reads z_i = [log mean x_f²/10 (F), log(1 + numel)/10, emb(t), progress(t, N), loss features] and
generates tensor i's MLP weights w_i = w_base + (h_i G)·gen_scale and its step multiplier
exp(h_i · w_lr):

    Δp = −d · exp(m · exp_mult) · (step_mult · exp(h_i · w_lr)).
"""
from __future__ import annotations

import torch

from lopt.torch.parts.factored import FactoredLeaf, decays_of
from lopt.torch.parts.features import lstm_inputs
from lopt.torch.parts.nn import as_columns, run_lstm
from lopt.torch.rule import Rule, register

__all__ = ["HyperLOptRule"]


@register("HyperLOpt")
class HyperLOptRule(Rule):
    """`lopt.HyperLOpt`'s update (the math is in the module docstring).

    Args:
      learned_opt: the `lopt.HyperLOpt`.
      theta: its meta-parameters (numpy arrays).
    """

    reads_loss = True

    def updates(self, items, ctx):
        lo, th = self.learned_opt, ctx.theta
        loss_feats = self.loss_features(items, ctx)
        dec = decays_of(th["decays"])
        leaves, stats = [], []
        for it in items:
            if it.param.numel() == 0:
                leaves.append(None)
                stats.append(torch.ones((lo.num_features,), dtype=ctx.dtype, device=ctx.device))
                continue
            leaf = FactoredLeaf(it, ctx.dtype, self.spec, self.ws)
            leaf.accumulate(dec)
            stats.append(leaf.mean_squares())
            leaves.append(leaf)
        stats = torch.stack(stats)
        ctx_feats = ctx.context_row(lo.timescales, items, loss_feats)
        h = run_lstm(th["lstm"], lstm_inputs(stats, items, ctx_feats), items)
        weights = th["w_base"] + (h @ th["generator"]) * lo.gen_scale
        lr_mult = torch.exp(h @ th["w_lr"])
        for i, (it, leaf) in enumerate(zip(items, leaves)):
            if leaf is None:
                yield torch.zeros(it.param.shape, dtype=ctx.dtype, device=ctx.device)
                continue
            layers, at = [], 0
            for a, b in lo.layer_shapes():
                layers.append((weights[i, at:at + a * b].reshape(a, b), weights[i, at + a * b:at + a * b + b]))
                at += a * b + b
            layers[0] = (layers[0][0] * torch.rsqrt(stats[i] + self.spec.constants["eps"])[:, None], layers[0][1])
            step = leaf.scaled_exp_step(as_columns(layers), lo.exp_mult, lo.step_mult * lr_mult[i])
            yield step.neg_()

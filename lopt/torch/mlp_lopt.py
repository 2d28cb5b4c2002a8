"""MLPLOpt's update in torch (`lopt.mlp_lopt`), and the accumulators and features it shares with
RNNMLPLOpt and NormMLPLOpt.

Per tensor (flat, in the parameter's own element order: every step here is elementwise or a
whole-tensor sum, so the layout does not matter):

    m_k ← β_k m_k + (1 − β_k) g,   v ← β_v v + (1 − β_v) g²                    (`accumulate_`)
    x   = [g, p, m_1..m_K, √v, g/√(v+ε), m_0.9/√(v+ε)]                          (`fill_features`)
    W1' = diag(1/rms(x_f)) W1                  (the per-tensor RMS folded into the first layer)
    (d, m) = MLP(x; bias b + emb(t) W_time (+ progress(t, N) W_progress))
    Δp  = −d · exp(m · exp_mult) · step_mult

A tensor is walked in blocks (`Item.chunk` elements) twice: once to update its accumulators and
sum its features' squares, once to run the MLP on each block's [F, c] features, so no [n, F]
feature array or [n, H] activation exists.
"""
from __future__ import annotations

from typing import Sequence

import torch

from lopt.torch import common
from lopt.torch.rule import Context, Item, Rule, register

__all__ = ["MLPLOptRule", "FlatLeaf", "fill_features", "accumulate_"]


def accumulate_(g: torch.Tensor, m: torch.Tensor, v: torch.Tensor, decays: torch.Tensor, rms_decay: float) -> None:
    """m_k ← β_k m_k + (1 − β_k) g and v ← β_v v + (1 − β_v) g², in place.

    Args:
      g: the gradient block [c].
      m: the momenta block [K, c] (a view into the state).
      v: the second-moment block [c].
      decays: β_k, [K].
      rms_decay: β_v.
    """
    m.mul_(decays[:, None]).addcmul_((1.0 - decays)[:, None], g[None, :])
    v.mul_(rms_decay).add_(torch.square(g) * (1.0 - rms_decay))


def fill_features(out: torch.Tensor, g: torch.Tensor, p: torch.Tensor, m: torch.Tensor, v: torch.Tensor,
                  mom_idx: int) -> torch.Tensor:
    """x = [g, p, m_1..m_K, √v, g/√(v+ε), m_idx/√(v+ε)] of a block, written into `out` [K + 5, c].

    Args:
      out: the [F, c] buffer.
      g: gradient block [c].
      p: parameter block [c].
      m: momenta block [K, c].
      v: second-moment block [c].
      mom_idx: the momentum of the last feature (the decay closest to 0.9).

    Returns:
      `out`.
    """
    k = m.shape[0]
    out[0].copy_(g)
    out[1].copy_(p)
    out[2:2 + k].copy_(m)
    torch.sqrt(v, out=out[2 + k])
    rsqrt_v = torch.add(v, common.EPS, out=out[4 + k]).rsqrt_()
    torch.mul(g, rsqrt_v, out=out[3 + k])
    torch.mul(m[mom_idx], rsqrt_v, out=out[4 + k])
    return out


class FlatLeaf:
    """One tensor's MLPLOpt-style accumulators as flat views, walked in blocks.

    Args:
      item: the parameter (its state holds "momenta" [K, *shape] and "second_moment" [*shape]).
      dtype: the compute dtype.
      mom_idx: the index of the momentum closest to 0.9.
      ws: the rule's scratch buffers.
    """

    def __init__(self, item: Item, dtype: torch.dtype, mom_idx: int, ws: common.Workspace):
        self.n = item.param.numel()
        self.g = item.grad.detach().reshape(-1).to(dtype)
        self.p = item.param.detach().reshape(-1).to(dtype)
        self.k = item.state["momenta"].shape[0]
        self.m = item.state["momenta"].view(self.k, self.n)
        self.v = item.state["second_moment"].view(self.n)
        self.chunk = item.chunk
        self.mom_idx = mom_idx
        self.ws = ws

    @property
    def num_features(self) -> int:
        """F = K + 5."""
        return self.k + 5

    def blocks(self):
        """(start, end) of the tensor's blocks."""
        return common.chunks(self.n, self.chunk)

    def scratch(self, name: str, rows: int, s: int, e: int) -> torch.Tensor:
        """A [rows, e − s] workspace buffer (valid until the next `scratch` of that name)."""
        return self.ws.get(name, (rows, e - s), self.g.dtype, self.g.device)

    def features(self, s: int, e: int) -> torch.Tensor:
        """The [F, e − s] features of elements s .. e − 1 (from the current accumulators), in the workspace."""
        x = self.scratch("features", self.num_features, s, e)
        return fill_features(x, self.g[s:e], self.p[s:e], self.m[:, s:e], self.v[s:e], self.mom_idx)

    def accumulate_and_sum(self, decays: torch.Tensor, rms_decay: float, want_sums: bool = True) -> torch.Tensor:
        """Updates the accumulators block by block and returns Σ x_f² over the tensor ([F]; zeros
        unless `want_sums`)."""
        sums = torch.zeros((self.num_features,), dtype=self.g.dtype, device=self.g.device)
        one_minus = 1.0 - decays
        for s, e in self.blocks():
            g, v = self.g[s:e], self.v[s:e]
            self.m[:, s:e].mul_(decays[:, None]).addcmul_(one_minus[:, None], g[None, :])
            g2 = torch.mul(g, g, out=self.scratch("square", 1, s, e)[0])
            v.mul_(rms_decay).add_(g2.mul_(1.0 - rms_decay))
            if want_sums:
                x = self.features(s, e)
                sums += torch.sum(torch.mul(x, x, out=self.scratch("squares", self.num_features, s, e)), dim=1)
        return sums

    def mlp_map(self, layers: Sequence[tuple[torch.Tensor, torch.Tensor]], fn) -> torch.Tensor:
        """[n]: fn(MLP output [out, c], s, e, out=[c]) written block by block (`common.mlp_columns`)
        into the workspace buffer "update" (valid until the next tensor's)."""
        result = self.ws.get("update", (self.n,), self.g.dtype, self.g.device)
        for s, e in self.blocks():
            fn(common.mlp_columns(self.features(s, e), layers, self.ws), s, e, result[s:e])
        return result

    def scaled_exp_step(self, layers, exp_mult: float, mult) -> torch.Tensor:
        """[n]: d · exp(m · exp_mult) · mult of the MLP's outputs (d, m), block by block."""
        def fn(o, s, e, out):
            t = torch.mul(o[1], exp_mult, out=self.scratch("exp", 1, s, e)[0]).exp_()
            torch.mul(o[0], t, out=out).mul_(mult)
        return self.mlp_map(layers, fn)


def mlp_state(param: torch.Tensor, num_decays: int, dtype: torch.dtype) -> dict:
    """Zero "momenta" [K, *shape] and "second_moment" [*shape] of one parameter."""
    z = lambda shape: torch.zeros(shape, dtype=dtype, device=param.device)
    return {"momenta": z((num_decays,) + tuple(param.shape)), "second_moment": z(tuple(param.shape))}


def first_bias(layer: dict, ctx: Context, items: Sequence[Item], timescales: Sequence[float]) -> torch.Tensor:
    """`lopt.nn.shared_bias` per item: b + emb(t) W_time (+ progress(t, N) W_progress), [L, H]."""
    bias = layer["b"] + ctx.embedding(timescales) @ layer["w_time"]
    if "w_progress" in layer:
        bias = bias + ctx.progress(items) @ layer["w_progress"]
    return bias


@register("MLPLOpt")
class MLPLOptRule(Rule):
    """`lopt.MLPLOpt`'s update (the math is in the module docstring).

    Args:
      learned_opt: the `lopt.MLPLOpt`.
      theta: its meta-parameters (numpy arrays).
    """

    def init_state(self, param, axes, dtype):
        return mlp_state(param, len(self.learned_opt.decays), dtype)

    def updates(self, items, ctx):
        lo, th = self.learned_opt, ctx.theta
        decays = torch.tensor(lo.decays, dtype=ctx.dtype, device=ctx.device)
        bias = first_bias(th["input"], ctx, items, lo.timescales)
        later = common.as_columns([(th[f"hidden_{i}"]["w"], th[f"hidden_{i}"]["b"]) for i in range(1, lo.hidden_layers)]
                                  + [(th["output"]["w"], th["output"]["b"])])
        for i, it in enumerate(items):
            if it.param.numel() == 0:
                yield torch.zeros(it.param.shape, dtype=ctx.dtype, device=ctx.device)
                continue
            leaf = FlatLeaf(it, ctx.dtype, lo._mom_idx, self.ws)
            sums = leaf.accumulate_and_sum(decays, lo.rms_decay)
            w1t = (th["input"]["w"] * torch.rsqrt(sums / leaf.n + common.EPS)[:, None]).t().contiguous()
            step = leaf.scaled_exp_step([(w1t, bias[i])] + later, lo.exp_mult, lo.step_mult)
            yield step.neg_().view(it.param.shape)

"""AdafacMLPLOpt's update in torch (`lopt.adafac_mlp_lopt`), and the factored accumulators and
features it shares with HyperLOpt (`FactoredLeaf`).

Accumulators, decays β = σ(θ_β) learned:

    m_k ← β_k m_k + (1 − β_k) g,  v ← β_v v + (1 − β_v) g²                 torch layout, like p
    r_j ← β_j r_j + (1 − β_j) mean_cols(g²),  c_j ← β_j c_j + (1 − β_j) mean_rows(g²)

The factored moments are the one axis-dependent part: "rows" and "cols" are the last two axes of
the tensor in JAX layout (`Item.axes`: for nn.Linear's [out, in] weight, rows are its inputs and
columns its outputs, as for the flax kernel [in, out]), and r_j, c_j are stored in JAX layout
([K_f, *jax_shape[:-1]] and [K_f, *jax_shape[:-2], jax_shape[-1]], as in `lopt.AdafacState`).
Vectors and scalars keep the full g² in r_j. The factors rr_j = (r_j / mean(r_j) + ε)^{-½} and
cr_j = (c_j + ε)^{-½} are permuted back into broadcastable torch-layout tensors, so the
F = 4 + 2K_m + 3K_f + K_m K_f features

    g, p, m_k, √v, m_k/√(v+ε), 1/√(v+ε), g·rr_j·cr_j, rr_j, cr_j, m_k·rr_j·cr_j

are formed block by block (blocks of the tensor's first torch axis) in the parameter's own layout.
The MLP (on the RMS-normalised features, first-layer bias b + emb(t) W_time (+ progress)) gives (d, m):

    Δp = −d · exp(m · exp_mult) · step_mult.
"""
from __future__ import annotations

from typing import Sequence

import torch

from lopt.torch import common
from lopt.torch.layout import inverse_axes
from lopt.torch.mlp_lopt import first_bias
from lopt.torch.rule import Item, Rule, register

__all__ = ["AdafacMLPLOptRule", "FactoredLeaf", "factored_state", "decays_of"]


def factored_state(param: torch.Tensor, axes: tuple, n_mom: int, n_fac: int, dtype: torch.dtype) -> dict:
    """Zero accumulators of one parameter: "momenta" [K_m, *shape], "rms" [*shape] (torch layout),
    "fac_row", "fac_col" (JAX layout, see the module docstring)."""
    shape = tuple(param.shape)
    jshape = tuple(shape[a] for a in axes)
    if len(shape) >= 2:
        row, col = (n_fac,) + jshape[:-1], (n_fac,) + jshape[:-2] + jshape[-1:]
    else:
        row, col = (n_fac,) + shape, (n_fac,)
    z = lambda s: torch.zeros(s, dtype=dtype, device=param.device)
    return {"momenta": z((n_mom,) + shape), "rms": z(shape), "fac_row": z(row), "fac_col": z(col)}


def decays_of(theta_decays: dict) -> dict:
    """β = σ(θ_β) of {"momentum" [K_m], "rms" [1], "adafactor" [K_f]}."""
    return {k: torch.sigmoid(v) for k, v in theta_decays.items()}


def _col(b: torch.Tensor, ndim: int) -> torch.Tensor:
    return b.reshape(b.shape + (1,) * ndim)


class FactoredLeaf:
    """One tensor's factored accumulators and its features, block by block.

    Args:
      item: the parameter (its state from `factored_state`).
      dtype: the compute dtype.
      ws: the rule's scratch buffers.
    """

    def __init__(self, item: Item, dtype: torch.dtype, ws: common.Workspace):
        st = item.state
        self.shape = tuple(item.param.shape)
        self.matrix = len(self.shape) >= 2
        self.n = item.param.numel()
        vec = (self.n,) if not self.matrix else self.shape  # scalars and vectors as flat vectors
        self.g = item.grad.detach().to(dtype).reshape(vec)
        self.p = item.param.detach().to(dtype).reshape(vec)
        self.m = st["momenta"].view((st["momenta"].shape[0],) + vec)
        self.v = st["rms"].view(vec)
        self.row = st["fac_row"] if self.matrix else st["fac_row"].view((-1,) + vec)
        self.col = st["fac_col"]
        self.axes, self.chunk, self.ws = item.axes, item.chunk, ws
        self.rr = self.cr = None

    @property
    def n_mom(self) -> int:
        """K_m."""
        return self.m.shape[0]

    @property
    def n_fac(self) -> int:
        """K_f."""
        return self.row.shape[0]

    @property
    def num_features(self) -> int:
        """F = 4 + 2K_m + 3K_f + K_m·K_f."""
        return 4 + 2 * self.n_mom + 3 * self.n_fac + self.n_mom * self.n_fac

    def accumulate(self, dec: dict) -> None:
        """One update of every accumulator (β from `decays_of`), then the factors rr_j and cr_j."""
        g, nd = self.g, self.g.ndim
        g2 = torch.square(g)
        b_mom, b_rms, b_fac = dec["momentum"], dec["rms"][0], dec["adafactor"]
        self.m.mul_(_col(b_mom, nd)).addcmul_(_col(1.0 - b_mom, nd), g[None])
        self.v.mul_(b_rms).add_((1.0 - b_rms) * g2)
        if self.matrix:
            g2j = g2.permute(self.axes)
            self.row.mul_(_col(b_fac, nd - 1)).add_(_col(1.0 - b_fac, nd - 1) * torch.mean(g2j, dim=-1))
            self.col.mul_(_col(b_fac, nd - 1)).add_(_col(1.0 - b_fac, nd - 1) * torch.mean(g2j, dim=-2))
            r = self.row / (torch.mean(self.row, dim=-1, keepdim=True) + 1e-30)
            to_torch = (0,) + tuple(1 + a for a in inverse_axes(self.axes))
            self.rr = torch.rsqrt(r + common.EPS).unsqueeze(-1).permute(to_torch)         # [K_f, broadcastable]
            self.cr = torch.rsqrt(self.col + common.EPS).unsqueeze(-2).permute(to_torch)
        else:
            self.row.mul_(_col(b_fac, nd)).add_(_col(1.0 - b_fac, nd) * g2)
            self.rr = self.cr = torch.rsqrt(self.row + common.EPS)                         # [K_f, n]

    def blocks(self):
        """(start, end) of the blocks of the first axis (of the flat vector for ndim < 2)."""
        return common.chunk_rows(self.g.shape, self.chunk)

    def features(self, s: int, e: int) -> torch.Tensor:
        """The [F, c] features of the block s .. e − 1 (the module docstring's order)."""
        sl = lambda x: x[:, s:e] if x.shape[1] != 1 else x
        g, p, m, v = self.g[s:e], self.p[s:e], self.m[:, s:e], self.v[s:e]
        rr, cr = sl(self.rr), sl(self.cr)
        fac = rr * cr if self.matrix else rr
        km, kf = self.n_mom, self.n_fac
        x = self.ws.get("features", (self.num_features,) + tuple(g.shape), g.dtype, g.device)
        rsqrt_v = torch.add(v, common.EPS, out=x[3 + 2 * km]).rsqrt_()
        x[0].copy_(g)
        x[1].copy_(p)
        x[2:2 + km].copy_(m)
        torch.sqrt(v, out=x[2 + km])
        torch.mul(m, rsqrt_v, out=x[3 + km:3 + 2 * km])
        at = 4 + 2 * km
        torch.mul(g, fac, out=x[at:at + kf])
        x[at + kf:at + 2 * kf].copy_(rr.expand((kf,) + tuple(g.shape)))
        x[at + 2 * kf:at + 3 * kf].copy_(cr.expand((kf,) + tuple(g.shape)))
        at += 3 * kf
        for k in range(km):
            torch.mul(m[k], fac, out=x[at + k * kf:at + (k + 1) * kf])
        return x.view(self.num_features, -1)

    def mean_squares(self) -> torch.Tensor:
        """mean(x_f²) over the tensor for each feature, [F]."""
        sums = torch.zeros((self.num_features,), dtype=self.g.dtype, device=self.g.device)
        for s, e in self.blocks():
            x = self.features(s, e)
            sums += torch.sum(torch.mul(x, x, out=self.ws.get("squares", x.shape, x.dtype, x.device)), dim=1)
        return sums / self.n

    def scaled_exp_step(self, layers: Sequence[tuple[torch.Tensor, torch.Tensor]], exp_mult: float,
                        mult) -> torch.Tensor:
        """d · exp(m · exp_mult) · mult of the MLP's outputs (d, m) over the blocks, in the parameter's
        shape (the workspace buffer "update", valid until the next tensor's)."""
        result = self.ws.get("update", self.g.shape, self.g.dtype, self.g.device)
        for s, e in self.blocks():
            o = common.mlp_columns(self.features(s, e), layers, self.ws)
            t = torch.mul(o[1], exp_mult, out=self.ws.get("exp", o[1].shape, o.dtype, o.device)).exp_()
            torch.mul(o[0], t, out=result[s:e].view(-1)).mul_(mult)
        return result.view(self.shape)


@register("AdafacMLPLOpt")
class AdafacMLPLOptRule(Rule):
    """`lopt.AdafacMLPLOpt`'s update (the math is in the module docstring).

    Args:
      learned_opt: the `lopt.AdafacMLPLOpt`.
      theta: its meta-parameters (numpy arrays).
    """

    def init_state(self, param, axes, dtype):
        lo = self.learned_opt
        return factored_state(param, axes, len(lo.momentum_decays), len(lo.adafactor_decays), dtype)

    def updates(self, items, ctx):
        lo, th = self.learned_opt, ctx.theta
        dec = decays_of(th["decays"])
        bias = first_bias(th["input"], ctx, items, lo.timescales)
        rest = common.as_columns([(th[f"hidden_{i}"]["w"], th[f"hidden_{i}"]["b"]) for i in range(1, lo.hidden_layers)]
                                 + [(th["output"]["w"], th["output"]["b"])])
        for i, it in enumerate(items):
            if it.param.numel() == 0:
                yield torch.zeros(it.param.shape, dtype=ctx.dtype, device=ctx.device)
                continue
            leaf = FactoredLeaf(it, ctx.dtype, self.ws)
            leaf.accumulate(dec)
            w1t = (th["input"]["w"] * torch.rsqrt(leaf.mean_squares() + common.EPS)[:, None]).t().contiguous()
            yield leaf.scaled_exp_step([(w1t, bias[i])] + rest, lo.exp_mult, lo.step_mult).neg_()

"""Adafactor-style factored accumulators in torch and the features read from them (`lopt.parts.factored`).

AdafacMLPLOpt and HyperLOpt (`FactoredLeaf`), decays β = σ(θ_β) learned (`decays_of`):

    m_k ← β_k m_k + (1 − β_k) g,  v ← β_v v + (1 − β_v) g²                 torch layout, like p
    r_j ← β_j r_j + (1 − β_j) mean_cols(g²),  c_j ← β_j c_j + (1 − β_j) mean_rows(g²)

The factored moments are the one axis-dependent part: "rows" and "cols" are the last two axes of
the tensor in JAX layout (`Item.axes`: for nn.Linear's [out, in] weight, rows are its inputs and
columns its outputs, as for the flax kernel [in, out]), and r_j, c_j are stored in JAX layout
([K_f, *jax_shape[:-1]] and [K_f, *jax_shape[:-2], jax_shape[-1]], as in `lopt.AdafacState`; the
spec's layout, `lopt.torch.parts.spec.param_state`). Vectors and scalars keep the full g² in r_j.
The factors rr_j = (r_j / (mean(r_j) + ε_row) + ε)^{-½} and cr_j = (c_j + ε)^{-½} (ε, ε_row the
spec's "eps" and "row_eps") are permuted back into broadcastable torch-layout tensors, so the
F = 4 + 2K_m + 3K_f + K_m K_f features

    g, p, m_k, √v, m_k/√(v+ε), 1/√(v+ε), g·rr_j·cr_j, rr_j, cr_j, m_k·rr_j·cr_j

are formed block by block (blocks of the tensor's first torch axis) in the parameter's own layout,
each in the row its name has in the spec (`lopt.parts.factored.feature_names`).
"""
from __future__ import annotations

import functools
from typing import Sequence

import torch

from lopt.parts.spec import ArchSpec
from lopt.torch.layout import inverse_axes
from lopt.torch.parts.layout import Workspace, chunk_rows
from lopt.torch.parts.nn import mlp_columns
from lopt.torch.parts.spec import feature_rows
from lopt.torch.rule import Item

__all__ = ["decays_of", "FactoredLeaf"]


@functools.lru_cache(maxsize=64)
def _rows(features: tuple, km: int, kf: int) -> dict:
    """The rows `FactoredLeaf.features` writes each group of features into, by name."""
    ks, js = range(1, km + 1), range(1, kf + 1)
    block = lambda names: feature_rows(features, list(names))
    return {"g": block(["g"]), "p": block(["p"]), "m": block(f"m_{k}" for k in ks), "sqrt_v": block(["sqrt_v"]),
            "m_over_sqrt_v": block(f"m_{k}_over_sqrt_v" for k in ks), "rsqrt_v": block(["rsqrt_v"]),
            "g_fac": block(f"g_over_sqrt_f_{j}" for j in js), "row": block(f"rsqrt_row_{j}" for j in js),
            "col": block(f"rsqrt_col_{j}" for j in js),
            "m_fac": [block(f"m_{k}_over_sqrt_f_{j}" for j in js) for k in ks]}


def decays_of(theta_decays: dict) -> dict:
    """β = σ(θ_β) of {"momentum" [K_m], "rms" [1], "adafactor" [K_f]}."""
    return {k: torch.sigmoid(v) for k, v in theta_decays.items()}


def _col(b: torch.Tensor, ndim: int) -> torch.Tensor:
    return b.reshape(b.shape + (1,) * ndim)


class FactoredLeaf:
    """One tensor's factored accumulators and its features, block by block.

    Args:
      item: the parameter (its state from `lopt.torch.parts.spec.param_state`).
      dtype: the compute dtype.
      spec: the architecture's spec (its feature order, "eps" and "row_eps").
      ws: the rule's scratch buffers.
    """

    def __init__(self, item: Item, dtype: torch.dtype, spec: ArchSpec, ws: Workspace):
        st = item.state
        self.features_order, self.eps, self.row_eps = spec.features, spec.constants["eps"], spec.constants["row_eps"]
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
        """F = 4 + 2K_m + 3K_f + K_m·K_f (the spec's)."""
        return len(self.features_order)

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
            r = self.row / (torch.mean(self.row, dim=-1, keepdim=True) + self.row_eps)
            to_torch = (0,) + tuple(1 + a for a in inverse_axes(self.axes))
            self.rr = torch.rsqrt(r + self.eps).unsqueeze(-1).permute(to_torch)         # [K_f, broadcastable]
            self.cr = torch.rsqrt(self.col + self.eps).unsqueeze(-2).permute(to_torch)
        else:
            self.row.mul_(_col(b_fac, nd)).add_(_col(1.0 - b_fac, nd) * g2)
            self.rr = self.cr = torch.rsqrt(self.row + self.eps)                         # [K_f, n]

    def blocks(self):
        """(start, end) of the blocks of the first axis (of the flat vector for ndim < 2)."""
        return chunk_rows(self.g.shape, self.chunk)

    def features(self, s: int, e: int) -> torch.Tensor:
        """The [F, c] features of the block s .. e − 1 (the module docstring's order)."""
        sl = lambda x: x[:, s:e] if x.shape[1] != 1 else x
        g, p, m, v = self.g[s:e], self.p[s:e], self.m[:, s:e], self.v[s:e]
        rr, cr = sl(self.rr), sl(self.cr)
        fac = rr * cr if self.matrix else rr
        km, kf = self.n_mom, self.n_fac
        rows = _rows(tuple(self.features_order), km, kf)
        x = self.ws.get("features", (self.num_features,) + tuple(g.shape), g.dtype, g.device)
        rsqrt_v = torch.add(v, self.eps, out=x[rows["rsqrt_v"]][0]).rsqrt_()
        x[rows["g"]][0].copy_(g)
        x[rows["p"]][0].copy_(p)
        x[rows["m"]].copy_(m)
        torch.sqrt(v, out=x[rows["sqrt_v"]][0])
        torch.mul(m, rsqrt_v, out=x[rows["m_over_sqrt_v"]])
        torch.mul(g, fac, out=x[rows["g_fac"]])
        x[rows["row"]].copy_(rr.expand((kf,) + tuple(g.shape)))
        x[rows["col"]].copy_(cr.expand((kf,) + tuple(g.shape)))
        for k in range(km):
            torch.mul(m[k], fac, out=x[rows["m_fac"][k]])
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
            o = mlp_columns(self.features(s, e), layers, self.ws)
            t = torch.mul(o[1], exp_mult, out=self.ws.get("exp", o[1].shape, o.dtype, o.device)).exp_()
            torch.mul(o[0], t, out=result[s:e].view(-1)).mul_(mult)
        return result.view(self.shape)

"""Momentum and second-moment accumulators in torch, and the per-parameter features read from them
(`lopt.parts.moment_features`, and the factored ones of `lopt.archs.adafac_mlp_lopt`).

Flat accumulators (MLPLOpt, RNNMLPLOpt, NormMLPLOpt, Celo2LOpt; `FlatLeaf`, `mlp_state`), per
tensor flat, in the parameter's own element order (every step is elementwise or a whole-tensor
sum, so the layout does not matter):

    m_k ← β_k m_k + (1 − β_k) g,   v ← β_v v + (1 − β_v) g²                    (`accumulate_`)
    x   = [g, p, m_1..m_K, √v, g/√(v+ε), m_0.9/√(v+ε)]                          (`fill_features`)

(`lopt.parts.moment_features.FEATURES`, m_0.9 the momentum of `learned_opt.momentum_index`).

Factored accumulators (AdafacMLPLOpt, HyperLOpt; `FactoredLeaf`, `factored_state`), decays
β = σ(θ_β) learned (`decays_of`):

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

Both walk a tensor in blocks (`Item.chunk` elements), so no [n, F] feature array or [n, H]
activation exists. `pow_f32` gives the bias corrections 1 − β^t as JAX's float32 pow does.
"""
from __future__ import annotations

from typing import Sequence

import torch

from lopt.torch.layout import inverse_axes
from lopt.torch.parts.features import EPS
from lopt.torch.parts.layout import Workspace, chunk_rows, chunks
from lopt.torch.parts.nn import mlp_columns
from lopt.torch.rule import Item

__all__ = ["pow_f32", "accumulate_", "fill_features", "FlatLeaf", "mlp_state", "factored_state", "decays_of",
           "FactoredLeaf"]


def pow_f32(base: float, exponent: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """β^t as JAX computes `python_float ** float32_array`: β rounded to float32, the power taken
    in float64 and rounded (within an ulp of XLA's float32 pow); in float64 for a float64 dtype.

    Args:
      base: β.
      exponent: t, any shape.
      dtype: the compute dtype.

    Returns:
      β^t in `dtype`, shaped like `exponent`.
    """
    if dtype == torch.float64:
        return torch.pow(torch.tensor(base, dtype=torch.float64, device=exponent.device), exponent.double())
    b = torch.tensor(base, dtype=torch.float32, device=exponent.device).double()
    return torch.pow(b, exponent.double()).to(dtype)


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
    rsqrt_v = torch.add(v, EPS, out=out[4 + k]).rsqrt_()
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

    def __init__(self, item: Item, dtype: torch.dtype, mom_idx: int, ws: Workspace):
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
        return chunks(self.n, self.chunk)

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
        """[n]: fn(MLP output [out, c], s, e, out=[c]) written block by block (`lopt.torch.parts.nn.mlp_columns`)
        into the workspace buffer "update" (valid until the next tensor's)."""
        result = self.ws.get("update", (self.n,), self.g.dtype, self.g.device)
        for s, e in self.blocks():
            fn(mlp_columns(self.features(s, e), layers, self.ws), s, e, result[s:e])
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

    def __init__(self, item: Item, dtype: torch.dtype, ws: Workspace):
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
            self.rr = torch.rsqrt(r + EPS).unsqueeze(-1).permute(to_torch)         # [K_f, broadcastable]
            self.cr = torch.rsqrt(self.col + EPS).unsqueeze(-2).permute(to_torch)
        else:
            self.row.mul_(_col(b_fac, nd)).add_(_col(1.0 - b_fac, nd) * g2)
            self.rr = self.cr = torch.rsqrt(self.row + EPS)                         # [K_f, n]

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
        x = self.ws.get("features", (self.num_features,) + tuple(g.shape), g.dtype, g.device)
        rsqrt_v = torch.add(v, EPS, out=x[3 + 2 * km]).rsqrt_()
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
            o = mlp_columns(self.features(s, e), layers, self.ws)
            t = torch.mul(o[1], exp_mult, out=self.ws.get("exp", o[1].shape, o.dtype, o.device)).exp_()
            torch.mul(o[0], t, out=result[s:e].view(-1)).mul_(mult)
        return result.view(self.shape)

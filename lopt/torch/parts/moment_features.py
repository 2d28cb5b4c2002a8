"""Momentum and second-moment accumulators in torch, and the per-parameter features read from them
(`lopt.parts.moment_features`; the factored ones are `lopt.torch.parts.factored`).

Flat accumulators (MLPLOpt, RNNMLPLOpt, NormMLPLOpt, Celo2LOpt; `FlatLeaf`), per tensor flat, in
the parameter's own element order (every step is elementwise or a whole-tensor sum, so the layout
does not matter):

    m_k ← β_k m_k + (1 − β_k) g,   v ← β_v v + (1 − β_v) g²                    (`accumulate_`)
    x   = [g, p, m_1..m_K, √v, g/√(v+ε), m_0.9/√(v+ε)]                          (`fill_features`)

Every feature goes into the row its name has in the architecture's spec (`spec.features`, from
`lopt.parts.moment_features.feature_names`), ε is the spec's constant "eps" and m_0.9 the momentum
of `learned_opt.momentum_index`; the state's entries come from the spec's layout
(`lopt.torch.parts.spec.param_state`).

A leaf is walked in blocks (`Item.chunk` elements), so no [n, F] feature array or [n, H]
activation exists. `pow_f32` gives the bias corrections 1 − β^t as JAX's float32 pow does.
"""
from __future__ import annotations

import functools
from typing import Sequence

import torch

from lopt.parts.spec import ArchSpec
from lopt.torch.parts.layout import Workspace, chunks
from lopt.torch.parts.nn import mlp_columns
from lopt.torch.parts.spec import feature_rows
from lopt.torch.rule import Item

__all__ = ["pow_f32", "accumulate_", "fill_features", "FlatLeaf"]


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


@functools.lru_cache(maxsize=64)
def _rows(features: tuple, k: int) -> tuple:
    """Where `fill_features` writes each feature, by name: (g, p, m_1..m_K, √v, g/√v, m_0.9/√v) rows."""
    one = lambda name: feature_rows(features, (name,)).start
    return (one("g"), one("p"), feature_rows(features, [f"m_{i + 1}" for i in range(k)]), one("sqrt_v"),
            one("g_over_sqrt_v"), one("m_0.9_over_sqrt_v"))


def fill_features(out: torch.Tensor, g: torch.Tensor, p: torch.Tensor, m: torch.Tensor, v: torch.Tensor,
                  mom_idx: int, features: Sequence[str], eps: float) -> torch.Tensor:
    """x = [g, p, m_1..m_K, √v, g/√(v+ε), m_idx/√(v+ε)] of a block, each written into the row of `out`
    its name has in `features`.

    Args:
      out: the [F, c] buffer.
      g: gradient block [c].
      p: parameter block [c].
      m: momenta block [K, c].
      v: second-moment block [c].
      mom_idx: the momentum of the last feature (the decay closest to 0.9).
      features: the spec's feature names, in order (`lopt.parts.moment_features.feature_names(K)`).
      eps: ε (the spec's "eps").

    Returns:
      `out`.
    """
    i_g, i_p, i_m, i_sqrt, i_g_v, i_m_v = _rows(tuple(features), m.shape[0])
    out[i_g].copy_(g)
    out[i_p].copy_(p)
    out[i_m].copy_(m)
    torch.sqrt(v, out=out[i_sqrt])
    rsqrt_v = torch.add(v, eps, out=out[i_m_v]).rsqrt_()
    torch.mul(g, rsqrt_v, out=out[i_g_v])
    torch.mul(m[mom_idx], rsqrt_v, out=out[i_m_v])
    return out


class FlatLeaf:
    """One tensor's MLPLOpt-style accumulators as flat views, walked in blocks.

    Args:
      item: the parameter (its state holds "momenta" [K, *shape], in the compute dtype or a lower
        precision, and "second_moment" [*shape]).
      dtype: the compute dtype.
      spec: the architecture's spec (its feature order and "eps").
      mom_idx: the index of the momentum closest to 0.9.
      ws: the rule's scratch buffers.
    """

    def __init__(self, item: Item, dtype: torch.dtype, spec: ArchSpec, mom_idx: int, ws: Workspace):
        self.n = item.param.numel()
        self.g = item.grad.detach().reshape(-1).to(dtype)
        self.p = item.param.detach().reshape(-1).to(dtype)
        self.k = item.state["momenta"].shape[0]
        stored = item.state["momenta"].view(self.k, self.n)
        # momenta stored in a lower precision (the optimizer's momentum_dtype) are updated and read in `dtype`
        # and stored back rounded once per step, by `accumulate_and_sum`
        self._stored = stored if stored.dtype != dtype else None
        self.m = stored if self._stored is None else stored.to(dtype)
        self.v = item.state["second_moment"].view(self.n)
        self.chunk = item.chunk
        self.mom_idx = mom_idx
        self.ws = ws
        self.features_order, self.eps = spec.features, spec.constants["eps"]

    @property
    def num_features(self) -> int:
        """F = K + 5 (the spec's)."""
        return len(self.features_order)

    def blocks(self):
        """(start, end) of the tensor's blocks."""
        return chunks(self.n, self.chunk)

    def scratch(self, name: str, rows: int, s: int, e: int) -> torch.Tensor:
        """A [rows, e − s] workspace buffer (valid until the next `scratch` of that name)."""
        return self.ws.get(name, (rows, e - s), self.g.dtype, self.g.device)

    def features(self, s: int, e: int) -> torch.Tensor:
        """The [F, e − s] features of elements s .. e − 1 (from the current accumulators), in the workspace."""
        x = self.scratch("features", self.num_features, s, e)
        return fill_features(x, self.g[s:e], self.p[s:e], self.m[:, s:e], self.v[s:e], self.mom_idx,
                             self.features_order, self.eps)

    def accumulate_and_sum(self, decays: torch.Tensor, rms_decay: float, want_sums: bool = True) -> torch.Tensor:
        """Updates the accumulators block by block and returns Σ x_f² over the tensor ([F]; zeros
        unless `want_sums`).

        The sums are read from the accumulators without writing the features: Σg², Σp², Σm_k², Σv
        (for Σ(√v)²), Σg²/(v+ε) and Σm_idx²/(v+ε), equal to the features' up to rounding."""
        sums = None
        decay, one_minus = decays[:, None], (1.0 - decays)[:, None]
        for s, e in self.blocks():
            g, v, m = self.g[s:e], self.v[s:e], self.m[:, s:e]
            m.mul_(decay).addcmul_(one_minus, g[None, :])
            g2 = torch.mul(g, g, out=self.scratch("square", 1, s, e)[0])
            v.mul_(rms_decay).add_(g2, alpha=1.0 - rms_decay)
            if want_sums:
                part = self._block_sums(g2, self.p[s:e], m, v, s, e)
                sums = part if sums is None else sums.add_(part)
        if self._stored is not None:
            self._stored.copy_(self.m)
        return sums if sums is not None else torch.zeros((self.num_features,), dtype=self.g.dtype,
                                                         device=self.g.device)

    def _block_sums(self, g2: torch.Tensor, p: torch.Tensor, m: torch.Tensor, v: torch.Tensor, s: int,
                    e: int) -> torch.Tensor:
        """Σ x_f² of one block, [F] in the features' order: Σg², Σp², Σm_k², Σv, Σg²/(v+ε), Σm_idx²/(v+ε)."""
        inv = torch.add(v, self.eps, out=self.scratch("inv_v", 1, s, e)[0]).reciprocal_()
        m_idx = m[self.mom_idx]
        m2 = torch.mul(m_idx, m_idx, out=self.scratch("m_sq", 1, s, e)[0])
        i_g, i_p, i_m, i_sqrt, i_g_v, i_m_v = _rows(tuple(self.features_order), self.k)
        sums = [None] * self.num_features
        sums[i_g], sums[i_p], sums[i_sqrt] = g2.sum(), torch.dot(p, p), v.sum()
        sums[i_g_v], sums[i_m_v] = torch.dot(g2, inv), torch.dot(m2, inv)
        sums[i_m] = [torch.dot(row, row) for row in m]
        return torch.stack(sums)

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

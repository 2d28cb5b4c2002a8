"""Adafactor-style factored accumulators and the per-parameter features read from them.

Shared by AdafacMLPLOpt and HyperLOpt (Metz et al. 2022's "small_fc_lopt" features). Accumulators
per tensor p with gradient g (float32; a leading axis indexes the decays):

    m_k   ← β_k m_k + (1 − β_k) g                      k over the momentum decays    [K_m, *p]
    v     ← β_v v + (1 − β_v) g²                        the RMS decay                 [*p]
    r_j   ← β_j r_j + (1 − β_j) mean_cols(g²)           j over the factored decays    [K_f, *p[:-1]]
    c_j   ← β_j c_j + (1 − β_j) mean_rows(g²)                                          [K_f, *p[:-2], p[-1]]
    v̂_j  = (r_j / mean(r_j)) ⊗ c_j                      (matrices: the last two axes are factored;
                                                          vectors and scalars keep the full g² in r_j)

and F = 4 + 2K_m + 3K_f + K_m·K_f features (28 with three decays of each kind), named in order by
`feature_names` (the order of the architectures' specs, `lopt.parts.spec`):

    g, p, m_k, √v, m_k·v^{-½}, v^{-½}, g·v̂_j^{-½}, r̃_j^{-½}, c_j^{-½}, m_k·v̂_j^{-½}   (all k, then all j; k-major)

with v^{-½} = (v + ε)^{-½}, ε = `features.EPS`, and r̃_j = r_j / (mean(r_j) + `ROW_EPS`).
`feature_mean_squares` gives each feature's mean square over the tensor (its RMS normalisation)
without forming the features of a big matrix; `state_fields` states the accumulators in a spec.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp

from lopt.parts import features as ft
from lopt.parts.layout import CPU, UpdateLayout
from lopt.parts.nn import logit
from lopt.parts.spec import PARAM, StateField, iteration_field, reorder

# added to the mean of a row moment before the row moment is divided by it
ROW_EPS = 1e-30


class AdafacState(NamedTuple):
    """The factored accumulators of every tensor: AdafacMLPLOpt's optimizer state, HyperLOpt's accumulators.

    Attributes:
      momenta: per leaf, float32 [K_m, *p.shape]: m_k.
      rms: per leaf, float32 [*p.shape]: v.
      fac_row: per leaf, float32 [K_f, *p.shape[:-1]] (matrices) or [K_f, *p.shape]: r_j.
      fac_col: per leaf, float32 [K_f, *p.shape[:-2], p.shape[-1]] (matrices) or [K_f] (unused): c_j.
      iteration: int32 []: the number of updates so far.
    """
    momenta: Any
    rms: Any
    fac_row: Any
    fac_col: Any
    iteration: jax.Array


class LeafAccum(NamedTuple):
    """The accumulators of one tensor (shapes as the per-leaf fields of `AdafacState`).

    Attributes:
      m: momenta [K_m, *p.shape].
      v: second moment [*p.shape].
      row: factored row moments r_j.
      col: factored column moments c_j.
    """
    m: jax.Array
    v: jax.Array
    row: jax.Array
    col: jax.Array


def init_accum(p: Any, n_mom: int, n_fac: int) -> LeafAccum:
    """Zero accumulators for one tensor (shapes as in `AdafacState`)."""
    shape = tuple(jnp.shape(p))
    row, col = (n_fac,) + _row_shape(shape), (n_fac,) + _col_shape(shape)
    z = lambda s: jnp.zeros(s, jnp.float32)
    return LeafAccum(z((n_mom,) + shape), z(shape), z(row), z(col))


def init_state(params: Any, n_mom: int, n_fac: int) -> AdafacState:
    """Zero accumulators for every tensor of `params` and step 0."""
    accs = jax.tree_util.tree_map(lambda p: init_accum(p, n_mom, n_fac), params)
    pick = lambda i: jax.tree_util.tree_map(lambda a: a[i], accs, is_leaf=lambda x: isinstance(x, LeafAccum))
    return AdafacState(pick(0), pick(1), pick(2), pick(3), jnp.zeros((), jnp.int32))


def _bcast(b: jax.Array, ndim: int) -> jax.Array:
    return b.reshape(b.shape + (1,) * ndim)


def accumulate(g: jax.Array, acc: LeafAccum, b_mom: jax.Array, b_rms: jax.Array, b_fac: jax.Array) -> LeafAccum:
    """One update of every accumulator of one tensor; g float32."""
    g2 = jnp.square(g)
    m = _bcast(b_mom, g.ndim) * acc.m + _bcast(1.0 - b_mom, g.ndim) * g
    v = b_rms * acc.v + (1.0 - b_rms) * g2
    if g.ndim >= 2:
        row_in, col_in = jnp.mean(g2, axis=-1), jnp.mean(g2, axis=-2)
        row = _bcast(b_fac, g.ndim - 1) * acc.row + _bcast(1.0 - b_fac, g.ndim - 1) * row_in
        col = _bcast(b_fac, g.ndim - 1) * acc.col + _bcast(1.0 - b_fac, g.ndim - 1) * col_in
    else:
        row = _bcast(b_fac, g.ndim) * acc.row + _bcast(1.0 - b_fac, g.ndim) * g2
        col = acc.col
    return LeafAccum(m, v, row, col)


def leaf_features(g: jax.Array, p: jax.Array, acc: LeafAccum, row_mean: Optional[jax.Array] = None) -> list[jax.Array]:
    """The per-parameter features of one tensor (see the module docstring), each an array
    broadcastable to p.shape; the factored ones keep their small [.., r, 1] / [.., 1, c] shape.
    `row_mean` [K_f, .., 1]: the mean of acc.row over its last axis, given when g and acc hold
    only a block of the tensor's rows (the row factors are normalised by the whole tensor's)."""
    n_mom, n_fac = acc.m.shape[0], acc.row.shape[0]
    rsqrt_v = jax.lax.rsqrt(acc.v + ft.EPS)
    ms = [acc.m[k] for k in range(n_mom)]
    row_rs, col_rs, fac_rs = [], [], []
    for j in range(n_fac):
        if g.ndim >= 2:
            mean = jnp.mean(acc.row[j], axis=-1, keepdims=True) if row_mean is None else row_mean[j]
            r = acc.row[j] / (mean + ROW_EPS)
            rr, cr = jax.lax.rsqrt(r + ft.EPS)[..., None], jax.lax.rsqrt(acc.col[j] + ft.EPS)[..., None, :]
            row_rs.append(rr)
            col_rs.append(cr)
            fac_rs.append(rr * cr)
        else:
            full = jax.lax.rsqrt(acc.row[j] + ft.EPS)
            row_rs.append(full)
            col_rs.append(full)
            fac_rs.append(full)
    feats = [g, p] + ms + [jnp.sqrt(acc.v)] + [m * rsqrt_v for m in ms] + [rsqrt_v]
    feats += [g * f for f in fac_rs] + row_rs + col_rs
    feats += [m * f for m in ms for f in fac_rs]
    return reorder(feats, _computed_names(n_mom, n_fac), feature_names(n_mom, n_fac))


# `feature_mean_squares` sums a matrix of at least this many blocks of rows block by block (the
# per-parameter architectures' plain sums wait for `features.SUM_MIN_BLOCKS`, 16: each row block
# here replaces a whole-tensor temporary, which the plain sums never form)
MIN_ROW_BLOCKS = 2


def feature_mean_squares(g: jax.Array, p: jax.Array, acc: LeafAccum, block: Optional[int] = None,
                         min_blocks: Optional[int] = None, layout: UpdateLayout = CPU) -> jax.Array:
    """mean(x_f²) over the tensor for each feature of `leaf_features`, in its order: [F].

    A matrix of at least `min_blocks` blocks of ⌊block / cols⌋ rows is reduced block by block
    (`_blockwise_mean_squares`), so that no temporary of the tensor's size exists (XLA's CPU
    runtime page-faults a fresh temporary in on every call). Smaller matrices and higher-rank
    tensors use `_matrix_mean_squares`; vectors and scalars reduce each feature over the whole
    tensor. All three give the same values up to float32 summation order.

    Args:
      g: the gradient, float32 [*s].
      p: the parameter, float32 [*s].
      acc: the tensor's accumulators, already updated with g (`accumulate`).
      block: parameters per block; None: the layout's `sum_block`.
      min_blocks: the fewest row blocks worth splitting a matrix into; None: `MIN_ROW_BLOCKS` (2).
      layout: the update layout (`lopt.parts.layout`) that cuts the sums into blocks.

    Returns:
      float32 [F], F = `num_leaf_features(K_m, K_f)`.
    """
    if g.ndim < 2:  # leaf_features come in feature_names' order
        return jnp.stack([jnp.mean(jnp.square(x)) for x in jnp.broadcast_arrays(*leaf_features(g, p, acc))])
    rows, cols = g.shape[-2:]
    block_rows = max(1, min(rows, (layout.sum_block if block is None else block) // cols))
    min_blocks = MIN_ROW_BLOCKS if min_blocks is None else min_blocks
    names = _computed_names(acc.m.shape[0], acc.row.shape[0]), feature_names(acc.m.shape[0], acc.row.shape[0])
    if g.ndim > 2 or rows < max(min_blocks, 2) * block_rows:
        return reorder(_matrix_mean_squares(g, p, acc), *names)
    return reorder(_blockwise_mean_squares(g, p, acc, block_rows, layout), *names)


def _blockwise_mean_squares(g: jax.Array, p: jax.Array, acc: LeafAccum, block_rows: int,
                            layout: UpdateLayout) -> jax.Array:
    """`feature_mean_squares` of a [rows, cols] matrix of at least 2 blocks, summed over blocks of
    `block_rows` rows (`UpdateLayout.blockwise_sum`).

    The factored features are x·rr_j·cr_j with x in (g, m_1..m_K): rank-1 factors u_j = rr_j² per
    row and w_j = cr_j² per column, so Σ_rc (x rr_j cr_j)² = Σ_r u_jr (x² w_jᵀ)_r: per block one
    [(1+K)·rows_b, cols] @ [cols, K_f] product of the squared base arrays, then a weighted sum
    over the rows. The plain features are fused sums of squares of the block. The row and column
    factors alone (broadcast over the other axis) are means of u_j and w_j. No block's F features
    are ever formed.
    """
    n_mom = acc.m.shape[0]
    row_mean = jnp.mean(acc.row, axis=-1, keepdims=True)
    u_all = jnp.square(jax.lax.rsqrt(acc.row / (row_mean + ROW_EPS) + ft.EPS))   # [K_f, rows], as in leaf_features
    w = jnp.square(jax.lax.rsqrt(acc.col + ft.EPS))                               # [K_f, cols]

    def block_sums(s, size):
        sl = lambda x, axis: jax.lax.dynamic_slice_in_dim(x, s, size, axis=axis)
        gb, pb, mb, vb = sl(g, 0), sl(p, 0), sl(acc.m, 1), sl(acc.v, 0)
        inv_v = jnp.square(jax.lax.rsqrt(vb + ft.EPS))
        ms = [mb[k] for k in range(n_mom)]
        plain = ([jnp.sum(jnp.square(gb)), jnp.sum(jnp.square(pb))] + [jnp.sum(jnp.square(m)) for m in ms]
                 + [jnp.sum(vb)] + [jnp.sum(jnp.square(m) * inv_v) for m in ms] + [jnp.sum(inv_v)])
        sq = jnp.concatenate([jnp.square(gb)[None], jnp.square(mb)]).reshape(-1, gb.shape[1])  # [(1+K)·size, cols]
        xw = (sq @ w.T).reshape(1 + n_mom, size, -1)                                         # [1+K, size, K_f]
        fac = jnp.einsum("qrj,jr->qj", xw, sl(u_all, 1))                                      # [1+K, K_f]
        return jnp.concatenate([jnp.stack(plain), fac.reshape(-1)])

    sums = layout.blockwise_sum(block_sums, g.shape[0], block_rows, min_blocks=2) / g.size  # the caller chose blocks
    n_plain = 4 + 2 * n_mom
    fac = sums[n_plain:].reshape(1 + n_mom, -1)
    return jnp.concatenate([sums[:n_plain], fac[0], jnp.mean(u_all, axis=-1), jnp.mean(w, axis=-1), fac[1:].reshape(-1)])


def _matrix_mean_squares(g: jax.Array, p: jax.Array, acc: LeafAccum) -> jax.Array:
    """`feature_mean_squares` of a matrix from whole-tensor reductions: the factored features are
    products u_r·w_c·x_rc, so their mean squares come from a few reductions and one matrix
    product per base array instead of one pass per feature (28 passes -> ~8):
    Σ_rc x²_rc u²_r w²_c = Σ_r u²_r (X² w²)_r."""
    n = g.size
    inv_v = 1.0 / (acc.v + ft.EPS)
    m2 = jnp.square(acc.m)
    red = lambda x: jnp.sum(x, axis=tuple(range(x.ndim - g.ndim, x.ndim))) / n  # keeps leading axes
    g2 = jnp.square(g)
    # factors u_j (rows) and w_j (cols) exactly as in leaf_features
    r = acc.row / (jnp.mean(acc.row, axis=-1, keepdims=True) + ROW_EPS)
    u2, w2 = 1.0 / (r + ft.EPS), 1.0 / (acc.col + ft.EPS)               # [K_f, .., r], [K_f, .., c]
    if g.ndim == 2:  # row-major matrix products: XLA made a transposed copy of m² for the einsum
        g_fac = (g2 @ w2.T).T                                                 # [K_f, r]
        m_fac = jnp.moveaxis((m2.reshape(-1, g.shape[-1]) @ w2.T).reshape(m2.shape[0], g.shape[0], -1), -1, 1)
    else:
        g_fac = jnp.einsum("...rc,j...c->j...r", g2, w2)                     # [K_f, .., r]
        m_fac = jnp.einsum("k...rc,j...c->kj...r", m2, w2)                   # [K_m, K_f, .., r]
    sum_r = lambda x: jnp.sum(x, axis=tuple(range(x.ndim - g.ndim + 1, x.ndim))) / n
    mean_small = lambda x: jnp.mean(x, axis=tuple(range(1, x.ndim)))
    parts = [red(g2)[None], red(jnp.square(p))[None], red(m2), red(acc.v)[None],
             red(m2 * inv_v), red(inv_v)[None], sum_r(g_fac * u2),
             mean_small(u2), mean_small(w2), sum_r(m_fac * u2).reshape(-1)]
    return jnp.concatenate(parts)


def num_leaf_features(n_mom: int, n_fac: int) -> int:
    """F = 4 + 2·n_mom + 3·n_fac + n_mom·n_fac, the number of features of `leaf_features`."""
    return len(feature_names(n_mom, n_fac))


def feature_names(n_mom: int, n_fac: int) -> tuple[str, ...]:
    """The F features' names, in the order of an architecture's spec (module docstring).

    Args:
      n_mom: K_m, the number of momenta.
      n_fac: K_f, the number of factored decays.

    Returns:
      ("g", "p", "m_1".."m_Km", "sqrt_v", "m_k_over_sqrt_v" (k = 1..K_m), "rsqrt_v",
      "g_over_sqrt_f_j", "rsqrt_row_j", "rsqrt_col_j" (j = 1..K_f each), "m_k_over_sqrt_f_j" (k-major)).
    """
    ks, js = range(1, n_mom + 1), range(1, n_fac + 1)
    return (("g", "p") + tuple(f"m_{k}" for k in ks) + ("sqrt_v",) + tuple(f"m_{k}_over_sqrt_v" for k in ks)
            + ("rsqrt_v",) + tuple(f"g_over_sqrt_f_{j}" for j in js) + tuple(f"rsqrt_row_{j}" for j in js)
            + tuple(f"rsqrt_col_{j}" for j in js) + tuple(f"m_{k}_over_sqrt_f_{j}" for k in ks for j in js))


def _computed_names(n_mom: int, n_fac: int) -> tuple[str, ...]:
    """The order `leaf_features` and the mean squares of a matrix compute the features in, by name
    (`spec.reorder` puts them into `feature_names`' order)."""
    ks, js = range(1, n_mom + 1), range(1, n_fac + 1)
    return (("g", "p", *(f"m_{k}" for k in ks), "sqrt_v", *(f"m_{k}_over_sqrt_v" for k in ks), "rsqrt_v")
            + tuple(f"g_over_sqrt_f_{j}" for j in js) + tuple(f"rsqrt_row_{j}" for j in js)
            + tuple(f"rsqrt_col_{j}" for j in js) + tuple(f"m_{k}_over_sqrt_f_{j}" for k in ks for j in js))


def _row_shape(s: tuple[int, ...]) -> tuple[int, ...]:
    return s[:-1] if len(s) >= 2 else s


def _col_shape(s: tuple[int, ...]) -> tuple[int, ...]:
    return s[:-2] + s[-1:] if len(s) >= 2 else ()


def state_fields(n_mom: int, n_fac: int) -> tuple[StateField, ...]:
    """The entries of an `AdafacState` in an architecture's spec (`lopt.parts.spec`).

    Args:
      n_mom: K_m.
      n_fac: K_f.

    Returns:
      "momenta" [K_m, *s], "rms" [*s] (elementwise), "fac_row" [K_f, *s[:-1]] ([K_f, *s] below
      rank 2), "fac_col" [K_f, *s[:-2], s[-1]] ([K_f] below rank 2), s the JAX-layout shape, and
      the update count "iteration".
    """
    return (StateField("momenta", PARAM, (n_mom,), doc="m_k, decay-major"),
            StateField("rms", PARAM, doc="v"),
            StateField("fac_row", PARAM, shape_of=lambda s: (n_fac,) + _row_shape(s), doc="r_j"),
            StateField("fac_col", PARAM, shape_of=lambda s: (n_fac,) + _col_shape(s), doc="c_j"),
            iteration_field())


def decay_logits(momentum_decays: Sequence[float], rms_decay: float, adafactor_decays: Sequence[float]) -> dict:
    """The learned decays' initial theta, {"momentum": [K_m], "rms": [1], "adafactor": [K_f]} (float32):
    logit(β) of each, so that β = σ(θ) starts at its configured value."""
    logits = lambda ds: jnp.asarray([logit(d) for d in ds], jnp.float32)
    return {"momentum": logits(momentum_decays), "rms": logits([rms_decay]), "adafactor": logits(adafactor_decays)}

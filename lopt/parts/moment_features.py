"""Momentum and second-moment accumulators, and the per-parameter features read from them.

Shared by MLPLOpt, NormMLPLOpt and RNNMLPLOpt (Metz et al. 2019's features). For a parameter
tensor p with gradient g, float32 accumulators of p's shape:

    m_k ← β_k m_k + (1 − β_k) g        k = 1..K (the momentum decays), stacked as [K, *p.shape]
    v   ← β_v v + (1 − β_v) g²

and F = K + 5 features per parameter:

    g, p, m_1..m_K, √v, g/√(v+ε), m_0.9/√(v+ε)

where m_0.9 is the momentum whose decay is closest to 0.9 (`momentum_index`) and ε =
`features.EPS`; `feature_names(K)` names them in this order, the order of an architecture's spec
(`lopt.parts.spec`), and `accumulator_fields(K)` states the accumulators there. Each architecture
normalises every feature by its root-mean-square over the tensor; `feature_sum_squares` gives the
sums of squares that RMS is taken from, and `normalized_feature_mlp` runs a small per-parameter
MLP on the normalized features.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp

from lopt.parts import features as ft
from lopt.parts.layout import UpdateLayout, blockwise_map
from lopt.parts.nn import elementwise_mlp
from lopt.parts.spec import PARAM, StateField, reorder


def init_accumulators(params: Any, num_decays: int) -> tuple[Any, Any]:
    """Zero accumulators for every leaf of `params`.

    Args:
      params: the parameter pytree.
      num_decays: K, the number of momenta.

    Returns:
      (momenta, second moments): pytrees like `params` with float32 leaves of shapes
      [K, *p.shape] and [*p.shape], sharded as each parameter (the momenta's K axis whole).
    """
    def zeros(p):  # zeros_like keeps p's sharding (explicit mesh) and takes a jax.ShapeDtypeStruct
        return jnp.zeros_like(p, jnp.float32)
    momenta = jax.tree_util.tree_map(lambda p: jnp.broadcast_to(zeros(p)[None], (num_decays,) + jnp.shape(p)), params)
    return momenta, jax.tree_util.tree_map(zeros, params)


def accumulator_fields(num_decays: int) -> tuple[StateField, StateField]:
    """The accumulators' entries in an architecture's spec (`lopt.parts.spec`).

    Args:
      num_decays: K, the number of momenta.

    Returns:
      ("momenta" [K, *p.shape], "second_moment" [*p.shape]), per-parameter, elementwise.
    """
    return (StateField("momenta", PARAM, (num_decays,), doc="m_k, decay-major"),
            StateField("second_moment", PARAM, doc="v"))


class MomentFeatures:
    """What an architecture that reads this module's features declares about them (a mixin).

    The architecture declares the field `decays` (β_1..β_K); the properties say where each
    feature is, so another implementation of the architecture (`lopt.torch`) reads them instead
    of repeating the rule.
    """

    @property
    def momentum_index(self) -> int:
        """The index k of m_0.9 among the momenta (`momentum_index(decays)`)."""
        return momentum_index(self.decays)

    @property
    def num_features(self) -> int:
        """F = K + 5, the number of per-parameter features (`feature_names`)."""
        return len(feature_names(len(self.decays)))


# The per-parameter features in the order every architecture reads them (K momenta in the middle).
FEATURES = ("g", "p", "m_1..m_K", "sqrt_v", "g_over_sqrt_v", "m_0.9_over_sqrt_v")


def feature_names(num_decays: int) -> tuple[str, ...]:
    """The F = K + 5 features' names in order: `FEATURES` with the momenta m_1..m_K spelled out.

    Args:
      num_decays: K.

    Returns:
      ("g", "p", "m_1", .., "m_K", "sqrt_v", "g_over_sqrt_v", "m_0.9_over_sqrt_v").
    """
    out = []
    for name in FEATURES:
        out += [f"m_{k + 1}" for k in range(num_decays)] if name == "m_1..m_K" else [name]
    return tuple(out)


def _computed_names(num_decays: int) -> tuple[str, ...]:
    """The order `leaf_features` and `feature_sum_squares` compute the features in, by name
    (`spec.reorder` puts them into `feature_names`' order)."""
    return ("g", "p", *(f"m_{k + 1}" for k in range(num_decays)), "sqrt_v", "g_over_sqrt_v", "m_0.9_over_sqrt_v")


def momentum_index(decays: Sequence[float]) -> int:
    """The index of the momentum decay closest to 0.9, the momentum of the feature m_0.9/√(v+ε).

    Args:
      decays: the momentum decays β_1..β_K (K ≥ 1).

    Returns:
      argmin_k |β_k − 0.9| (the first such k on ties).
    """
    return min(range(len(decays)), key=lambda i: abs(decays[i] - 0.9))


def accumulate(g: jax.Array, m: jax.Array, v: jax.Array, decays: jax.Array,
               rms_decay: float) -> tuple[jax.Array, jax.Array]:
    """One update of a tensor's accumulators: m_k ← β_k m_k + (1 − β_k) g, v ← β_v v + (1 − β_v) g².

    Call it on the state in the parameter's own shape and reshape afterwards: then a donated
    optimizer state is updated in place (after a reshape to [K, n] XLA copies the momenta into
    the output buffers, as their shapes no longer match).

    Args:
      g: the gradient, float32 [*p.shape].
      m: the momenta, float32 [K, *p.shape].
      v: the second moment, float32 [*p.shape].
      decays: β_1..β_K, float32 [K].
      rms_decay: β_v.

    Returns:
      (m, v), updated, of the shapes given.
    """
    b = decays.reshape((-1,) + (1,) * g.ndim)
    return b * m + (1.0 - b) * g, rms_decay * v + (1.0 - rms_decay) * jnp.square(g)


def leaf_features(g: jax.Array, p: jax.Array, m: jax.Array, v: jax.Array, mom_idx: int) -> list[jax.Array]:
    """The F = K + 5 un-normalised features of one tensor (or one block of it).

    Args:
      g: the gradient, float32 [*s].
      p: the parameter, float32 [*s].
      m: the momenta, float32 [K, *s].
      v: the second moment, float32 [*s].
      mom_idx: the index of m_0.9 (`momentum_index`).

    Returns:
      [g, p, m_1, .., m_K, √v, g/√(v+ε), m_0.9/√(v+ε)] in `feature_names(K)`' order, each float32 [*s].
    """
    rsqrt_v = jax.lax.rsqrt(v + ft.EPS)
    k = m.shape[0]
    return reorder([g, p, *m, jnp.sqrt(v), g * rsqrt_v, m[mom_idx] * rsqrt_v], _computed_names(k), feature_names(k))


def _sum_squares(g: jax.Array, p: jax.Array, m: jax.Array, v: jax.Array, mom_idx: int) -> jax.Array:
    """Σ x_f² over every element of g [*s] (m [K, *s]) for the features of `leaf_features`, in the
    order computed (`_computed_names`): float32 [F]."""
    rsqrt_v = jax.lax.rsqrt(v + ft.EPS)
    one = lambda x: jnp.sum(jnp.square(x))[None]
    return jnp.concatenate([one(g), one(p), jnp.sum(jnp.square(m), axis=tuple(range(1, m.ndim))), one(jnp.sqrt(v)),
                            one(g * rsqrt_v), one(m[mom_idx] * rsqrt_v)])


def feature_sum_squares(g: jax.Array, p: jax.Array, m: jax.Array, v: jax.Array, mom_idx: int,
                        layout: Optional[UpdateLayout] = None) -> jax.Array:
    """Σ x_f² over a tensor for each feature x_f of `leaf_features`, in its order.

    With a `layout`, the sums are taken as it cuts them (`UpdateLayout.blockwise_sum`: block by
    block on a CPU, so a big tensor's reductions read each block from cache). Without, each is
    one reduction over the whole tensor, faster for an update vmapped over many models. Either
    way one reduction per feature, the K momenta in one. A tensor in its own shape (rank ≠ 1, or
    one the layout keeps in shape, `UpdateLayout.keeps_shape`) is summed over all its axes at once.

    Args:
      g: the gradient, float32 [n] (or [*s], in the tensor's own shape).
      p: the parameter, float32 [n] (or [*s]).
      m: the momenta, float32 [K, n] (or [K, *s]).
      v: the second moment, float32 [n] (or [*s]).
      mom_idx: the index of m_0.9 (`momentum_index`).
      layout: the update layout that cuts the sums into blocks; None: over the whole tensor at once.

    Returns:
      float32 [F], F = K + 5.
    """
    def block(start, size):
        return _sum_squares(*(jax.lax.dynamic_slice_in_dim(x, start, size, axis=x.ndim - 1) for x in (g, p, m, v)),
                            mom_idx)
    if g.ndim != 1 or (layout is not None and layout.keeps_shape(g)):  # a tensor in its own shape: sums over all axes
        sums = _sum_squares(g, p, m, v, mom_idx)
    else:
        sums = layout.blockwise_sum(block, g.shape[-1]) if layout is not None else block(0, g.shape[-1])
    return reorder(sums, _computed_names(m.shape[0]), feature_names(m.shape[0]))


def normalized_feature_mlp(g: jax.Array, p: jax.Array, m: jax.Array, v: jax.Array, mom_idx: int,
                           first: tuple[jax.Array, jax.Array], rest: Sequence[tuple[jax.Array, jax.Array]],
                           block: int, layout: UpdateLayout) -> jax.Array:
    """A per-parameter ReLU MLP on a flat tensor's features, each divided by its RMS over the tensor.

    MLP(x / rms(x)) with x the F = K + 5 features of `leaf_features`. The normalisation is folded
    into the first layer's weights, (x / rms) W₁ = x (W₁ / rms), and the MLP runs as unrolled
    multiply-adds (`nn.elementwise_mlp`) over blocks of at most `block` elements written in place
    (`layout.blockwise_map`), so no temporary bigger than a block's features exists. A tensor given
    in its own shape (rank ≠ 1, or kept in shape by the layout: sharded) runs in one elementwise
    pass over that shape, never flattened.

    Args:
      g: the gradient, float32 [n] (or [*s], in the tensor's own shape).
      p: the parameter, float32 [n] (or [*s]).
      m: the momenta, float32 [K, n] (or [K, *s]).
      v: the second moment, float32 [n] (or [*s]).
      mom_idx: the index of m_0.9 (`momentum_index`).
      first: (W₁ [F, H], b₁ [H]), the first layer (b₁ may carry per-tensor terms, e.g. a step embedding).
      rest: [(W [in, out], b [out]), ...], the later layers, ReLU between them; the last has one output.
      block: elements per block of a cache-sized layout (`UpdateLayout.fixed_block`).
      layout: the update layout (how the per-tensor sums and the MLP's blocks are cut).

    Returns:
      float32 [n] (or [*s]): the MLP's output per element.
    """
    n = g.size
    rms_inv = jax.lax.rsqrt(feature_sum_squares(g, p, m, v, mom_idx, layout) / n + ft.EPS)
    layers = [(first[0] * rms_inv[:, None], first[1])] + list(rest)
    if g.ndim != 1 or layout.keeps_shape(g):  # in the tensor's own shape: one elementwise pass, no blocks
        return elementwise_mlp(leaf_features(g, p, m, v, mom_idx), layers)[0]
    c = min(layout.fixed_block(block), n)

    def one(start):
        sl = lambda x: jax.lax.dynamic_slice_in_dim(x, start, c, axis=x.ndim - 1)
        return elementwise_mlp(leaf_features(sl(g), sl(p), sl(m), sl(v), mom_idx), layers)[0][None]

    return blockwise_map(one, n, c, 1, like=g)[0]

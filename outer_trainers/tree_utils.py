"""Pytree helpers shared by truncated steps, estimators and the learner.

- `tree_where(pred, a, b)`: leafwise `jnp.where` with a scalar or leading-axis predicate.
- `tree_all_finite(tree)`: whether every inexact leaf is finite.
- `masked_mean(x, mask)`: the mean of x over the entries where mask holds.
- `tree_weighted_sum(w, tree)`: Σ_i w_i x_i over the leading axis of every leaf (e.g. ĝ = Σ_i w_i ε_i).
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp


def tree_where(pred: jax.Array, on_true: Any, on_false: Any) -> Any:
    """Leafwise `jnp.where(pred, on_true, on_false)`.

    Args:
        pred: bool, scalar or with the leading axes of every leaf (e.g. [P] for P particles); it is
            broadcast over each leaf's trailing axes.
        on_true: a pytree.
        on_false: a pytree of the same structure and shapes as `on_true`.

    Returns:
        A pytree of that structure: each leaf is `on_true`'s where `pred`, else `on_false`'s.
    """
    def select(a, b):
        p = jnp.reshape(pred, jnp.shape(pred) + (1,) * (jnp.ndim(a) - jnp.ndim(pred)))
        return jnp.where(p, a, b)
    return jax.tree_util.tree_map(select, on_true, on_false)


def tree_all_finite(tree: Any) -> jax.Array:
    """Whether every inexact (float or complex) leaf of `tree` is finite.

    Args:
        tree: a pytree of arrays; integer and bool leaves are ignored.

    Returns:
        bool []: True iff no inexact leaf holds a NaN or an infinity (True for a tree without any).
    """
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree_util.tree_leaves(tree)
              if jnp.issubdtype(jnp.result_type(x), jnp.inexact)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.asarray(True)


def masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    """Σ_{mask} x / max(#mask, 1): the mean over masked-in entries, 0 when there are none.

    Args:
        x: float array; entries where `mask` is False may be non-finite (they are never summed).
        mask: bool array of x's shape.

    Returns:
        float [] of x's dtype.
    """
    return jnp.sum(jnp.where(mask, x, 0.0)) / jnp.maximum(jnp.sum(mask.astype(x.dtype)), 1.0)


def tree_weighted_sum(w: jax.Array, tree: Any) -> Any:
    """Σ_i w_i x_i over the leading axis of every leaf (e.g. an ES estimate Σ_i w_i ε_i).

    Args:
        w: float [N].
        tree: a pytree with leaves [N, ...].

    Returns:
        A pytree of that structure with leaves [...].
    """
    return jax.tree_util.tree_map(lambda x: jnp.tensordot(w, x, axes=1), tree)

"""Trace-time checks of pytrees: the inputs of `tx.update`, and theta against its architecture.

Shapes are static, so every check here runs once, while jax traces, and costs nothing per step.
Each names the first leaf path that differs.
"""
from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp


def leaf_path(path: tuple) -> str:
    """A leaf's path as jax writes it (e.g. "['layer']['w']"); "(the root)" for a lone leaf.

    Args:
      path: a key path from `jax.tree_util.tree_flatten_with_path`.

    Returns:
      The printable path.
    """
    return jax.tree_util.keystr(path) or "(the root)"


def tree_mismatch(got: Any, want: Any, want_name: str = "the expected tree", *,
                  check_dtypes: bool = False) -> Optional[str]:
    """The first difference between two pytrees' structures or leaf shapes, or None if they match.

    Shapes are static, so this is free inside jit / vmap / grad (it runs once, at trace time).

    Args:
      got: the pytree given (leaves: arrays, tracers, Python scalars or `jax.ShapeDtypeStruct`s).
      want: the pytree it must match.
      want_name: what `want` is, for the description (e.g. "the params").
      check_dtypes: also compare leaf dtypes (as jax sees them: a float64 numpy leaf is float32
        unless x64 is enabled); a leaf that is not an array or number then counts as a mismatch.

    Returns:
      None, or a description: "missing leaf PATH", "unexpected leaf PATH" (with how many more),
      "leaf PATH has shape S, but S' in WANT_NAME" (or "dtype D, but D'"), or the two tree
      structures when only their containers differ (e.g. a dict where a FrozenDict is expected).
    """
    got_leaves, got_def = jax.tree_util.tree_flatten_with_path(got)
    want_leaves, want_def = jax.tree_util.tree_flatten_with_path(want)
    if got_def != want_def:
        got_paths, want_paths = [leaf_path(p) for p, _ in got_leaves], [leaf_path(p) for p, _ in want_leaves]
        parts = []
        for kind, paths, others in (("missing", want_paths, got_paths), ("unexpected", got_paths, want_paths)):
            known = set(others)
            absent = [p for p in paths if p not in known]
            if absent:
                more = f" (and {len(absent) - 1} more)" if len(absent) > 1 else ""
                parts.append(f"{kind} leaf {absent[0]}{more}")
        return "; ".join(parts) or f"the same leaves in other containers: {got_def}, but {want_def} in {want_name}"
    for (path, g), (_, w) in zip(got_leaves, want_leaves):
        if tuple(jnp.shape(g)) != tuple(jnp.shape(w)):
            return f"leaf {leaf_path(path)} has shape {tuple(jnp.shape(g))}, but {tuple(jnp.shape(w))} in {want_name}"
        if check_dtypes:
            try:
                dtype = jnp.result_type(g)
            except TypeError:
                return f"leaf {leaf_path(path)} is a {type(g).__name__}, not an array"
            if dtype != jnp.result_type(w):
                return f"leaf {leaf_path(path)} has dtype {dtype}, but {jnp.result_type(w)} in {want_name}"
    return None


def check_grads_match_params(updates: Any, params: Any, name: str) -> None:
    """A clear error unless the gradients have the params' tree structure and leaf shapes.

    Args:
      updates: the gradients (or updates) given to `tx.update`.
      params: the parameters given to `tx.update`.
      name: the optimizer's name, for the message.

    Raises:
      ValueError: naming the first leaf path that differs (at trace time: no cost per step).
    """
    mismatch = tree_mismatch(updates, params, "the params")
    if mismatch is not None:
        raise ValueError(f"{name}: the gradients given to tx.update do not match the params: {mismatch}; "
                         f"pass gradients with the params' tree and leaf shapes (as jax.grad of a loss of "
                         f"the params returns them)")


def require_params(updates: Any, params: Any, name: str) -> None:
    """Learned optimizers read the parameters: a clear error when `tx.update` was given none, or
    params whose tree or leaf shapes differ from the gradients' (`check_grads_match_params`).

    Args:
      updates: the gradients given to `tx.update`.
      params: the parameters given to `tx.update` (required).
      name: the optimizer's name, for the message.
    """
    if params is None:
        raise ValueError(f"{name} needs params: call tx.update(grads, state, params)")
    check_grads_match_params(updates, params, name)
    check_real_floating(updates, params, name)


def check_real_floating(updates: Any, params: Any, name: str) -> None:
    """A clear error unless every gradient and parameter leaf is a real floating-point number.

    A learned optimizer's features and update are real: a complex leaf would lose its imaginary
    part, an integer one would get an update rounded to zero, and a float0 gradient (`jax.grad`
    with `allow_int`) has no values. Such leaves are refused, naming the first one, rather than
    optimised wrongly: split complex parameters into real and imaginary parts
    (`optax.contrib.split_real_and_imaginary(tx)`), and keep integer leaves out of the optimizer
    (`optax.partition` with `optax.set_to_zero()` for them). Python floats and ints count as float32.

    Args:
      updates: the gradients given to `tx.update`.
      params: the parameters (same tree structure).
      name: the optimizer's name, for the message.

    Raises:
      TypeError: naming the first leaf path whose gradient or parameter is not a real float.
    """
    treedef = jax.tree_util.tree_structure(updates)
    paths = [p for p, _ in jax.tree_util.tree_flatten_with_path(updates)[0]]
    for path, g, p in zip(paths, treedef.flatten_up_to(updates), treedef.flatten_up_to(params)):
        for what, x in (("gradient", g), ("parameter", p)):
            dtype = jax.dtypes.float0 if getattr(x, "dtype", None) == jax.dtypes.float0 else jnp.result_type(x)
            if dtype == jax.dtypes.float0 or not jnp.issubdtype(dtype, jnp.floating):
                shown = "float0" if dtype == jax.dtypes.float0 else dtype
                raise TypeError(
                    f"{name}: the {what} of leaf {leaf_path(path)} has dtype {shown}, but it updates real "
                    f"floating-point parameters only. Complex parameters: wrap the optimizer in "
                    f"optax.contrib.split_real_and_imaginary(tx); integer parameters or float0 gradients: leave "
                    f"them out (optax.partition with optax.set_to_zero() for them)")


def is_abstract(tree: Any) -> bool:
    """Whether any leaf of `tree` is a `jax.ShapeDtypeStruct` (a shape without values).

    Args:
      tree: a pytree, e.g. the params given to `tx.init`.

    Returns:
      a Python bool.
    """
    return any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree_util.tree_leaves(tree))


def leaves_of(tree: Any, *others: Any) -> tuple[Any, list, list[list]]:
    """(treedef, leaves of `tree`, leaves of each of `others` flattened up to `tree`)."""
    treedef = jax.tree_util.tree_structure(tree)
    return treedef, treedef.flatten_up_to(tree), [treedef.flatten_up_to(o) for o in others]

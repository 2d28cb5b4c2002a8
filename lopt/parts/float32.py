"""Run an optax transform in float32: float32 state, updates cast back to each parameter's dtype.

The convention of every lopt optimizer (docs/drop_in_optax.md): bfloat16 params keep bfloat16 updates
and a float32 state, also inside `lax.scan`, where a bfloat16 state promoted by a float32
hyper-parameter would change the carry's type.
The learnable-hyper-parameter optimizers (`lopt.archs.learnable_hparams`, `learnable_decay`) use it.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from lopt.parts import tree_checks


def to_float32(tree: Any) -> Any:
    """Floating leaves as float32; `jax.ShapeDtypeStruct` leaves (abstract init) stay abstract.

    Args:
      tree: a pytree of arrays (or ShapeDtypeStructs).

    Returns:
      The tree with its floating leaves in float32; other leaves unchanged.
    """
    def cast(x):
        if not jnp.issubdtype(jnp.result_type(x.dtype if hasattr(x, "dtype") else x), jnp.floating):
            return x
        if isinstance(x, jax.ShapeDtypeStruct):
            return jax.ShapeDtypeStruct(x.shape, jnp.float32, sharding=x.sharding)
        return jnp.asarray(x, jnp.float32)
    return jax.tree_util.tree_map(cast, tree)


def in_float32(inner: optax.GradientTransformation, name: str) -> optax.GradientTransformationExtraArgs:
    """`inner` run in float32: float32 state, updates cast back to each parameter's dtype.

    u = cast(inner(f32(g), s, f32(p)), dtype(p)); without params, to each gradient's dtype. With
    float32 inputs this is `inner` itself, bit for bit. Gradients given with params must match
    their tree and leaf shapes (`tree_checks.check_grads_match_params`, at trace time).

    Args:
      inner: the optax transform (its hyper-parameters may be traced float32 values).
      name: the optimizer's name, for error messages.

    Returns:
      An `optax.GradientTransformationExtraArgs`; `params` stays optional, as in optax.
    """
    inner = optax.with_extra_args_support(inner)

    def init_fn(params):
        return inner.init(to_float32(params))

    def update_fn(updates, state, params=None, **extra_args):
        if params is not None:
            tree_checks.check_grads_match_params(updates, params, name)
        new, state = inner.update(to_float32(updates), state, to_float32(params), **extra_args)
        like = updates if params is None else params
        return jax.tree_util.tree_map(lambda u, x: jnp.asarray(u).astype(jnp.result_type(x)), new, like), state

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)

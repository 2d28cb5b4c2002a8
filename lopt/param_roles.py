"""Parameter roles: what each leaf of a params pytree is, and which of its axes are inputs.

A step rule that follows μP (`NormMLPLOpt(fan_in_ref=...)`) needs each weight's fan-in, the
number of inputs summed into one output, and the product of "every axis but the last" is wrong
for common layers. Each leaf gets a `ParamRole`:

    kind         what it is                                   fan_in
    "matrix"     a weight summed over its reduction axes:      ∏ shape[reduction_axes]
                 dense [in, out]                                in
                 conv [*spatial, in, out]                       ∏ spatial · in   (spatial_axes: the window's)
                 attention q/k/v [d_model, heads, head_dim]     d_model
                 attention out [heads, head_dim, d_model]       heads · head_dim
    "embedding"  a lookup table [vocab, features], read one    —  (no fan-in factor, see below)
                 row per token
    "vector"     biases, norm scales and offsets, every         —  (absolute steps)
                 leaf of rank < 2

A conv kernel's role also names its spatial (window) axes, `spatial_axes`, a subset of its reduction
axes: the kernel is shared across positions, which a step rule may treat apart (e.g. the weight-decay
rule's `wd_conv_loss_free`, `lopt.rules.weight_decay`). Dense and attention weights have none.

An embedding is input-like in μP: its input is a one-hot vector, so its step does not shrink with
the vocabulary or the width; a step rule gives it the relative step of a matrix at the reference
width (no 1/fan_in factor).

    roles = param_roles.infer(params)                          # a tree of ParamRole, like params
    roles = param_roles.infer(params, weight_dimension_numbers=dims, strict=True)

Inference reads each leaf's path (dict keys, attribute names; haiku's "a/~/b" module names are
split at "/") and shape, statically (Python ints; nothing traced):

  1. rank < 2, or a leaf named bias, b, scale or offset (flax's attention biases are [heads,
     head_dim]): "vector".
  2. a leaf whose name contains "embed" (flax `embedding`, haiku `embeddings`, `pos_embed`):
     "embedding".
  3. rank 2: "matrix", reduction axis 0 (dense layers of flax, haiku and nnx; haiku's attention
     projections; LSTM weights).
  4. rank ≥ 3 inside a module named query, key or value (flax linen / nnx attention): reduction
     axis 0; inside one named out: every axis but the last; inside a module whose name contains
     "conv": the spatial axes and the input-channel axis (haiku's ConvNDTranspose, whose "w" is
     [*spatial, out, in], reduces over its last axis instead); spatial axes: all but the last two.
  5. any other rank ≥ 3 leaf cannot be read: a conv kernel's layout is assumed (every axis but the
     last reduced, all but the last two spatial), and `infer` warns once per path and shape, naming
     both and the assumption; with `strict=True` it raises instead.

Users state roles themselves with `weight_dimension_numbers`, in the spirit of
`optax.contrib.muon`'s `muon_weight_dimension_numbers`: either a pytree with the params' structure
(or a prefix of it: one entry for a whole subtree) whose leaves are `ParamRole`s,
`optax.contrib.MuonDimensionNumbers(reduction_axis, output_axis)` (a "matrix") or None (infer
this one), or a callable `(path, shape) -> ParamRole | MuonDimensionNumbers | None` with path the
leaf's names as a tuple of str (e.g. ("params", "Dense_0", "kernel")) and shape a tuple of ints.
"""
from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Any, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import optax.contrib

__all__ = ["ParamRole", "MATRIX", "EMBEDDING", "VECTOR", "KINDS", "matrix", "infer", "infer_role",
           "leaf_names", "WeightDimensionNumbers"]

KINDS = ("matrix", "embedding", "vector")
VECTOR_NAMES = ("bias", "b", "scale", "offset")
ATTENTION_INPUTS = ("query", "key", "value")
ATTENTION_OUTPUT = ("out",)
# the attribute a flax nnx Variable holds its array in: not part of the parameter's name
_VALUE_ATTRS = ("value", "raw_value")


@dataclasses.dataclass(frozen=True)
class ParamRole:
    """What a parameter leaf is, for a step rule: its kind and, for a "matrix", its input axes.

    Attributes:
      kind: "matrix", "embedding" or "vector" (module docstring).
      reduction_axes: a matrix's input axes, non-negative, sorted (empty for the other kinds).
      spatial_axes: a conv kernel's window axes, a subset of `reduction_axes`, sorted (empty for
        every other leaf).
    """
    kind: str
    reduction_axes: tuple[int, ...] = ()
    spatial_axes: tuple[int, ...] = ()

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown parameter role {self.kind!r}; known: {KINDS}")
        axes = tuple(int(a) for a in self.reduction_axes)
        if self.kind == "matrix" and not axes:
            raise ValueError("a 'matrix' role needs at least one reduction (input) axis")
        if self.kind != "matrix" and axes:
            raise ValueError(f"only a 'matrix' role has reduction axes, got {self.kind!r} with {axes}")
        spatial = tuple(sorted(int(a) for a in self.spatial_axes))
        if not set(spatial) <= set(axes):
            raise ValueError(f"spatial axes {spatial} must be reduction axes of a 'matrix', got {self.kind!r} "
                             f"with reduction axes {axes}")
        object.__setattr__(self, "reduction_axes", axes)
        object.__setattr__(self, "spatial_axes", spatial)

    @property
    def is_conv(self) -> bool:
        """Whether the leaf is a conv kernel (it has spatial axes)."""
        return bool(self.spatial_axes)

    def fan_in(self, shape: Sequence[int]) -> Optional[int]:
        """The number of inputs summed into one output: ∏ shape[reduction_axes] for a matrix, None otherwise.

        Args:
          shape: the leaf's shape.

        Returns:
          a Python int, or None for an embedding or a vector.

        Raises:
          ValueError: a reduction axis outside the shape.
        """
        if self.kind != "matrix":
            return None
        if max(self.reduction_axes) >= len(shape):
            raise ValueError(f"reduction axes {self.reduction_axes} do not fit a leaf of shape {tuple(shape)}")
        return math.prod(int(shape[a]) for a in self.reduction_axes)


EMBEDDING = ParamRole("embedding")
VECTOR = ParamRole("vector")
WeightDimensionNumbers = Union[ParamRole, "optax.contrib.MuonDimensionNumbers", None]
_SPEC_TYPES = (ParamRole, optax.contrib.MuonDimensionNumbers)


def matrix(reduction_axes: Union[int, Sequence[int]] = 0, ndim: Optional[int] = None,
           spatial_axes: Sequence[int] = ()) -> ParamRole:
    """A "matrix" role with these input axes (negative axes need `ndim`).

    Args:
      reduction_axes: an axis or axes summed over (the inputs).
      ndim: the leaf's rank, to resolve negative axes.
      spatial_axes: for a conv kernel, its window axes (among the reduction axes); empty otherwise.

    Returns:
      ParamRole("matrix", sorted non-negative axes, sorted spatial axes).
    """
    axes = (reduction_axes,) if isinstance(reduction_axes, int) else tuple(reduction_axes)
    spatial = tuple(spatial_axes)
    if any(a < 0 for a in axes + spatial):
        if ndim is None:
            raise ValueError(f"negative axes {axes}, {spatial} need the leaf's rank")
        axes, spatial = tuple(a % ndim for a in axes), tuple(a % ndim for a in spatial)
    if len(set(axes)) != len(axes) or len(set(spatial)) != len(spatial):
        raise ValueError(f"repeated axes: reduction {axes}, spatial {spatial}")
    return ParamRole("matrix", tuple(sorted(axes)), tuple(sorted(spatial)))


MATRIX = matrix(0)


def leaf_names(path: Sequence[Any]) -> tuple[str, ...]:
    """A key path (from `jax.tree_util.tree_flatten_with_path`) as names: dict keys, attribute names
    and sequence indices as str, haiku module names split at "/" (the "~" parts dropped), and a
    trailing nnx `.value` dropped.

    Args:
      path: a jax key path.

    Returns:
      e.g. ("params", "MultiHeadDotProductAttention_0", "query", "kernel").
    """
    keys = list(path)
    while keys and isinstance(keys[-1], jax.tree_util.GetAttrKey) and keys[-1].name in _VALUE_ATTRS:
        keys.pop()
    names = []
    for k in keys:
        if isinstance(k, jax.tree_util.DictKey):
            s = str(k.key)
        elif isinstance(k, jax.tree_util.GetAttrKey):
            s = k.name
        elif isinstance(k, jax.tree_util.SequenceKey):
            s = str(k.idx)
        else:
            s = str(getattr(k, "key", k))
        names += [part for part in s.split("/") if part not in ("", "~")]
    return tuple(names)


def infer_role(path: Sequence[str], shape: Sequence[int]) -> tuple[ParamRole, Optional[str]]:
    """The role of one leaf from its names and shape (rules 1-5 of the module docstring).

    Args:
      path: the leaf's names (`leaf_names`), possibly empty.
      shape: its shape.

    Returns:
      (role, None) when the leaf was read; (the assumed role, what was assumed) when it was not.
    """
    shape = tuple(int(s) for s in shape)
    ndim = len(shape)
    leaf = path[-1].lower() if path else ""
    parent = path[-2].lower() if len(path) > 1 else ""
    if ndim < 2 or leaf in VECTOR_NAMES:
        return VECTOR, None
    if "embed" in leaf:
        return EMBEDDING, None
    if ndim == 2:
        return MATRIX, None
    spatial = tuple(range(ndim - 2))
    if parent in ATTENTION_INPUTS:
        return MATRIX, None
    if parent in ATTENTION_OUTPUT:
        return matrix(tuple(range(ndim - 1))), None
    if "conv" in parent:
        if "transpose" in parent and leaf == "w":  # haiku ConvNDTranspose: w is [*spatial, out, in]
            return matrix(spatial + (ndim - 1,), spatial_axes=spatial), None
        return matrix(spatial + (ndim - 2,), spatial_axes=spatial), None
    return matrix(spatial + (ndim - 2,), spatial_axes=spatial), (
        f"read as a conv kernel [*spatial, in, out]: fan_in = prod(shape[:-1]) = {math.prod(shape[:-1])}")


def _as_role(spec: Any, names: tuple[str, ...], shape: tuple[int, ...]) -> ParamRole:
    """A user's entry for one leaf as a ParamRole, checked against the leaf's shape."""
    where = "/".join(names) or "(the root)"
    if isinstance(spec, optax.contrib.MuonDimensionNumbers):
        red = spec.reduction_axis if not isinstance(spec.reduction_axis, int) else (spec.reduction_axis,)
        out = spec.output_axis if not isinstance(spec.output_axis, int) else (spec.output_axis,)
        if len(shape) < 2:
            raise ValueError(f"weight_dimension_numbers: {where} of shape {shape} has rank < 2; "
                             f"MuonDimensionNumbers need a matrix (use param_roles.VECTOR)")
        red, out = tuple(a % len(shape) for a in red), tuple(a % len(shape) for a in out)
        if set(red) & set(out):
            raise ValueError(f"weight_dimension_numbers: {where}: reduction axes {red} and output axes {out} overlap")
        spec = matrix(red)
    if not isinstance(spec, ParamRole):
        raise TypeError(f"weight_dimension_numbers: {where}: expected a ParamRole, an "
                        f"optax.contrib.MuonDimensionNumbers or None, got {type(spec).__name__}")
    if spec.kind == "matrix":
        if len(shape) < 2:
            raise ValueError(f"weight_dimension_numbers: {where} of shape {shape} cannot be a 'matrix' (rank < 2)")
        if max(spec.reduction_axes) >= len(shape):
            raise ValueError(f"weight_dimension_numbers: {where}: reduction axes {spec.reduction_axes} do not fit "
                             f"shape {shape}")
    return spec


class _Box:
    """Holds one user entry while it is broadcast over a subtree (None would vanish from a pytree)."""

    def __init__(self, spec):
        self.spec = spec


def _user_specs(dims: Any, params: Any) -> list:
    """The user's entry for each leaf of params (flatten order), a prefix tree broadcast."""
    if dims is None:
        return [None] * len(jax.tree_util.tree_leaves(params))
    is_spec = lambda x: x is None or isinstance(x, _SPEC_TYPES)
    try:
        boxed = jax.tree_util.tree_map(lambda s, sub: jax.tree_util.tree_map(lambda _: _Box(s), sub), dims, params,
                                       is_leaf=is_spec)
    except (ValueError, TypeError) as e:
        raise ValueError("weight_dimension_numbers must be a callable (path, shape) -> role, or a pytree with the "
                         "params' structure (or a prefix of it) whose leaves are ParamRole, "
                         f"optax.contrib.MuonDimensionNumbers or None; it does not match the params: {e}") from None
    return [b.spec for b in jax.tree_util.tree_leaves(boxed, is_leaf=lambda x: isinstance(x, _Box))]


_WARNED: set = set()


def infer(params: Any, weight_dimension_numbers: Any = None, *, strict: bool = False) -> Any:
    """Every leaf's role: the user's where given, else inferred (module docstring).

    Static: reads only paths and shapes (params may hold tracers or ShapeDtypeStructs).

    Args:
      params: a parameter pytree (flax linen/nnx, haiku, or plain dicts).
      weight_dimension_numbers: None (infer all), a pytree (the params' structure or a prefix) of
        ParamRole / optax.contrib.MuonDimensionNumbers / None, or a callable
        `(path: tuple[str, ...], shape: tuple[int, ...]) -> ParamRole | MuonDimensionNumbers | None`.
      strict: raise on a leaf inference cannot read instead of warning.

    Returns:
      A pytree of `ParamRole` with the params' structure.

    Raises:
      ValueError: with `strict`, a leaf that neither the user nor inference can read (the message
        names each, its shape and how to state it); a user entry that does not fit its leaf.

    Warns (UserWarning), once per path and shape in a process: a rank ≥ 3 leaf that inference cannot
    read, naming it, its shape and the role assumed.
    """
    flat, treedef = jax.tree_util.tree_flatten_with_path(params)
    specs = None if callable(weight_dimension_numbers) else _user_specs(weight_dimension_numbers, params)
    roles, unread = [], []
    for i, (path, leaf) in enumerate(flat):
        names, shape = leaf_names(path), tuple(int(s) for s in jnp.shape(leaf))
        spec = weight_dimension_numbers(names, shape) if callable(weight_dimension_numbers) else specs[i]
        if spec is not None:
            roles.append(_as_role(spec, names, shape))
            continue
        role, assumed = infer_role(names, shape)
        if assumed is not None:
            unread.append((jax.tree_util.keystr(path) or "(the root)", shape, assumed))
        roles.append(role)
    if unread:
        lines = "; ".join(f"{p} {s}: {a}" for p, s, a in unread)
        how = ("state its input axes with weight_dimension_numbers (e.g. "
               "optax.contrib.MuonDimensionNumbers(reduction_axis=(0,), output_axis=(1, 2)) or lopt.param_roles.EMBEDDING)")
        if strict:
            raise ValueError(f"cannot tell the input axes of {len(unread)} parameter(s): {lines}. To fix it, {how}")
        new = [u for u in unread if u[:2] not in _WARNED]
        if new:
            _WARNED.update(u[:2] for u in new)
            warnings.warn(f"lopt.param_roles: cannot tell the input axes of {'; '.join(f'{p} {s}: {a}' for p, s, a in new)}. "
                          f"If that is wrong, {how}", stacklevel=2)
    return jax.tree_util.tree_unflatten(treedef, roles)

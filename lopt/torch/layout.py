"""Tensor layouts: which axes of a torch parameter the JAX optimizer's axis-dependent rules see.

JAX/flax/haiku kernels put the input axis before the output axis, torch the other way round:

    dense:  flax [in, out]               torch nn.Linear.weight [out, in]
    conv:   flax [kh, kw, in, out]       torch nn.ConvNd.weight [out, in, kh, kw] (1-3 spatial axes)

Most of a learned optimizer's update is elementwise, or reduces over a whole tensor, and does not
care. Some rules do: AdafacMLPLOpt and HyperLOpt factor the second moment over the last two axes
(row and column statistics), NormMLPLOpt's `fan_in_ref` reads fan_in = ∏ shape[:-1] (every axis
but the output axis) and its `orthogonalize` option orthogonalizes 2-D tensors, and Celo2LOpt
orthogonalizes each matrix read as [∏ shape[:-1], shape[-1]]. So each torch
parameter is given an axis order, `axes`, with `param.permute(axes)` the tensor as the JAX
optimizer would hold it, and every axis-dependent statistic is taken on that view (the state
keeps the torch parameter's own layout for everything elementwise).

The default, `"torch"`, is the torch convention of nn.Linear and nn.Conv1d/2d/3d: tensors of ndim
< 2 as they are; ndim ≥ 2 [out, in, *spatial] -> [*spatial, in, out], i.e. axes
(2, …, ndim − 1, 1, 0). Other modules store their weights differently; give their parameters their
own parameter group with a `layout` option:

- `"jax"` (or `"identity"`): the tensor already has JAX's layout. nn.Embedding.weight
  [num_embeddings, dim] is flax's nn.Embed layout, so it wants "jax";
- a tuple of axes: e.g. nn.ConvTranspose2d.weight [in, out, kh, kw] -> flax ConvTranspose's
  [kh, kw, in, out] is (2, 3, 0, 1);
- a callable `param -> layout` (any of the above), e.g. to choose by shape.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence, Union

import numpy as np
import torch

__all__ = ["Layout", "LAYOUTS", "default_axes", "resolve_axes", "inverse_axes", "to_jax", "from_jax"]

Layout = Union[str, Sequence[int], Callable[[torch.Tensor], Any]]
LAYOUTS = ("torch", "jax", "identity")


def default_axes(ndim: int) -> tuple:
    """The torch-convention axes of a tensor of `ndim` axes: identity below 2, else (2, …, ndim − 1, 1, 0).

    Args:
      ndim: the number of axes.

    Returns:
      The permutation, a tuple of ints.
    """
    if ndim < 2:
        return tuple(range(ndim))
    return tuple(range(2, ndim)) + (1, 0)


def resolve_axes(layout: Layout, param: torch.Tensor) -> tuple:
    """The axes (torch axes in JAX order) that `layout` gives `param`.

    Args:
      layout: "torch", "jax" / "identity", a tuple of axes, or a callable param -> one of those.
      param: the parameter.

    Returns:
      A permutation of range(param.ndim).

    Raises:
      ValueError: an unknown layout name, or axes that are not a permutation of the parameter's axes.
    """
    if callable(layout) and not isinstance(layout, str):
        layout = layout(param)
    if isinstance(layout, str):
        if layout == "torch":
            return default_axes(param.ndim)
        if layout in ("jax", "identity"):
            return tuple(range(param.ndim))
        raise ValueError(f"unknown layout {layout!r}: use one of {LAYOUTS}, a tuple of axes or a callable "
                         f"param -> layout (see lopt.torch.layout)")
    axes = tuple(int(a) for a in layout)
    if sorted(axes) != list(range(param.ndim)):
        raise ValueError(f"layout {axes} is not a permutation of the axes of a parameter of shape "
                         f"{tuple(param.shape)}: give one axis order per parameter of that rank (its own "
                         f"parameter group) or a callable param -> layout")
    return axes


def inverse_axes(axes: Sequence[int]) -> tuple:
    """The permutation that undoes `axes`: x.permute(axes).permute(inverse_axes(axes)) is x."""
    inv = [0] * len(axes)
    for i, a in enumerate(axes):
        inv[a] = i
    return tuple(inv)


def to_jax(x: Any, layout: Layout = "torch") -> np.ndarray:
    """A torch tensor as a numpy array in the JAX layout (e.g. an nn.Linear weight -> a flax kernel).

    Args:
      x: a torch tensor.
      layout: its layout (see the module docstring).

    Returns:
      A numpy array, x.permute(axes).
    """
    t = torch.as_tensor(x).detach()
    return t.permute(resolve_axes(layout, t)).cpu().numpy()


def from_jax(a: Any, layout: Layout = "torch") -> torch.Tensor:
    """A JAX-layout array as a torch tensor in the torch layout (the inverse of `to_jax`).

    Args:
      a: an array in JAX layout (numpy or jax).
      layout: the torch tensor's layout; a callable is given a tensor of the JAX array's shape.

    Returns:
      A contiguous CPU torch tensor.
    """
    t = torch.as_tensor(np.array(a))
    axes = resolve_axes(layout, t)
    return t.permute(inverse_axes(axes)).contiguous()

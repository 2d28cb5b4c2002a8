"""A parameter's torch state from an architecture's spec (`lopt.parts.spec`): the layout is read, never restated.

`param_state(spec, param, axes, dtype)` makes, for one parameter, every field of `spec.state` that a
torch parameter's state holds (`StateField.torch_per_param`), filled with its initial value:

- `PARAM` fields, elementwise: [*dims, *param.shape], in the parameter's own (torch) layout;
  with a `shape_of`: shape_of(the JAX-layout shape), in the JAX layout (e.g. factored moments).
- `TENSOR` and `STEP` fields: [*dims] (a `STEP` field, one per step in JAX, is kept per parameter).

float32 fields take the compute dtype (float64 for float64 parameters), as the rules compute in it.
"""
from __future__ import annotations

import torch

from lopt.parts.spec import ArchSpec

__all__ = ["param_state", "feature_rows"]


def param_state(spec: ArchSpec, param: torch.Tensor, axes: tuple, dtype: torch.dtype) -> dict:
    """The state of one parameter before its first update, from `spec`'s layout.

    Args:
      spec: the architecture's `ArchSpec`.
      param: the parameter.
      axes: its axes in JAX order (`param.permute(axes)` is the JAX view).
      dtype: the compute dtype.

    Returns:
      {field.key: tensor} on the parameter's device, for every field a torch parameter holds.
    """
    shape = tuple(param.shape)
    jax_shape = tuple(shape[a] for a in axes)
    state = {}
    for field in spec.state:
        if not field.torch_per_param:
            continue
        if field.dtype != "float32":
            raise ValueError(f"{spec.name}'s state field {field.name!r} of dtype {field.dtype} has no torch form")
        size = tuple(field.dims) + shape if field.elementwise else field.shape(jax_shape)
        state[field.key] = torch.full(size, field.fill, dtype=dtype, device=param.device)
    return state


def feature_rows(spec_features, names) -> slice:
    """The rows of the features `names` in a spec's feature order, as one slice.

    Args:
      spec_features: the spec's feature names, in order.
      names: the features a rule writes together (e.g. the momenta m_1..m_K), in their order.

    Returns:
      slice(i, i + len(names)) where they are consecutive rows in that order.

    Raises:
      ValueError: a name is missing, or they are not consecutive in that order.
    """
    order = tuple(spec_features)
    missing = [n for n in names if n not in order]
    if missing:
        raise ValueError(f"the spec's features {order} lack {missing}")
    first = order.index(names[0])
    if tuple(order[first:first + len(names)]) != tuple(names):
        raise ValueError(f"lopt.torch writes the features {tuple(names)} as one block of rows; the spec's order "
                         f"{order} puts them apart")
    return slice(first, first + len(names))

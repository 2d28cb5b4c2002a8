"""Parameter roles of torch parameters (`lopt.param_roles`): a group's `role` option, or one inferred from its axes.

- `role_of(param, role)`  the role kind ("matrix", "embedding" or "vector") of a torch parameter
- `jax_role(kind, shape)` the `lopt.param_roles.ParamRole` of that kind for the JAX-layout shape
"""
from __future__ import annotations

import torch

from lopt import param_roles
from lopt.param_roles import KINDS

__all__ = ["role_of", "jax_role"]


def role_of(param: torch.Tensor, role=None) -> str:
    """A parameter's role kind (`lopt.param_roles.KINDS`): the group's `role` option, or by default
    "vector" below 2 axes and "matrix" (fan_in from the JAX-layout axes but the last) from 2.

    Raises:
      ValueError: an unknown role, or "matrix" / "embedding" for a tensor of fewer than 2 axes.
    """
    if role is None:
        return "vector" if param.ndim < 2 else "matrix"
    if role not in KINDS:
        raise ValueError(f"unknown parameter role {role!r}: use one of {KINDS} (lopt.param_roles) or None")
    if role != "vector" and param.ndim < 2:
        raise ValueError(f"a parameter of shape {tuple(param.shape)} cannot have the role {role!r} (fewer than 2 axes)")
    return role


def jax_role(kind: str, jax_shape: tuple) -> param_roles.ParamRole:
    """The `lopt.param_roles.ParamRole` of a torch parameter of role `kind` and JAX-layout shape:
    a "matrix" reduces over every axis but the last."""
    if kind == "matrix":
        return param_roles.matrix(tuple(range(len(jax_shape) - 1)))
    return param_roles.ParamRole(kind)

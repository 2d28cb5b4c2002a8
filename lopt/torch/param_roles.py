"""Parameter roles of torch parameters (`lopt.param_roles`), read from the modules that hold them.

- `role_of(param, role)`          the role kind ("matrix", "embedding" or "vector") of one parameter:
                                  a group's `role` option, or one inferred from its number of axes
- `jax_role(kind, shape)`         the `lopt.param_roles.ParamRole` of that kind for the JAX-layout shape
- `module_roles(model)`           every parameter's role and layout from the module that holds it
- `ModuleRoles`                   what `module_roles` returns: `roles.role(p)`, `roles.layout(p)`

`module_roles` reads each parameter's module, not its shape:

    module                                     parameter   role         layout (`lopt.torch.layout`)
    nn.Embedding, nn.EmbeddingBag              weight      "embedding"  "jax" ([num, dim], flax's Embed)
    nn.Linear (and subclasses), nn.Bilinear    weight      "matrix"     "torch" ([out, in])
    nn.Conv1d/2d/3d                            weight      "matrix"     "torch" ([out, in, *k])
    nn.ConvTranspose1d/2d/3d                   weight      "matrix"     [in, out, *k] -> [*k, in, out]
    transformers.pytorch_utils.Conv1D (GPT-2)  weight      "matrix"     "jax" ([in, out])
    nn.RNN/LSTM/GRU, nn.MultiheadAttention     weight_*    "matrix"     "torch" ([out, in])
    norms (LayerNorm, RMSNorm, BatchNorm, …)   all         "vector"
    any module                                 bias, < 2 axes  "vector"

A parameter held by several modules (tied weights, e.g. GPT-2's token embedding and its output
head) is read once, and an embedding module wins: it is the lookup table. Any other parameter of
two or more axes is read from its shape alone ("matrix", torch layout: what `role_of` and the
default layout assume), and `module_roles` warns once, naming every such parameter; with
`strict_roles=True` it raises instead. Given `named_parameters()` rather than a module, names are
all there is: "embed", "wte" or "wpe" in a name reads as an embedding, "bias" or "norm" as a
vector, everything else of ≥ 2 axes from its shape (with the warning).
"""
from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Iterable, Optional, Union

import torch

from lopt import param_roles
from lopt.param_roles import KINDS

__all__ = ["role_of", "jax_role", "module_roles", "ModuleRoles", "RoleFromShapeWarning"]

_NORMS = (torch.nn.LayerNorm, torch.nn.GroupNorm, torch.nn.LocalResponseNorm,
          torch.nn.modules.batchnorm._NormBase) + ((torch.nn.RMSNorm,) if hasattr(torch.nn, "RMSNorm") else ())
_CONV_T = (torch.nn.ConvTranspose1d, torch.nn.ConvTranspose2d, torch.nn.ConvTranspose3d)
_TORCH_MATRICES = (torch.nn.Linear, torch.nn.Bilinear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d,
                   torch.nn.RNNBase, torch.nn.MultiheadAttention)


class RoleFromShapeWarning(UserWarning):
    """A parameter's role was read from its shape alone (no module or name said what it is)."""


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
    a "matrix" reduces over every axis but the last; one of 3 or more axes is read as a conv kernel
    [*k, in, out], its spatial axes all but the last two (torch's matrices of that rank are its
    convolutions, and nn.Bilinear's weight, which is read so too)."""
    if kind == "matrix":
        ndim = len(jax_shape)
        return param_roles.matrix(tuple(range(ndim - 1)), spatial_axes=tuple(range(ndim - 2)))
    return param_roles.ParamRole(kind)


@dataclasses.dataclass(frozen=True)
class ParamInfo:
    """One parameter as `module_roles` read it.

    Attributes:
      name: its first qualified name (e.g. "transformer.wte.weight").
      role: "matrix", "embedding" or "vector".
      layout: its layout ("torch", "jax" or a tuple of axes; `lopt.torch.layout`).
      reason: what the role was read from (the module's class, a name, or "shape").
    """
    name: str
    role: str
    layout: Any
    reason: str


class ModuleRoles:
    """Each parameter's role and layout (`module_roles` builds it), keyed by the tensor itself.

    Pass `roles.role` and `roles.layout` as a `lopt.torch` optimizer's `role` and `layout` options
    (callables, resolved per parameter when the optimizer is built), or read `roles.info`.

    Attributes:
      info: {id(param): ParamInfo} for every parameter read.
    """

    def __init__(self, info: dict):
        self.info = info

    def _get(self, param: torch.Tensor) -> ParamInfo:
        try:
            return self.info[id(param)]
        except KeyError:
            raise ValueError(f"a parameter of shape {tuple(param.shape)} is not one of the module's parameters "
                             f"read by lopt.torch.param_roles.module_roles") from None

    def role(self, param: torch.Tensor) -> str:
        """The parameter's role kind."""
        return self._get(param).role

    def layout(self, param: torch.Tensor) -> Any:
        """The parameter's layout (`lopt.torch.layout`)."""
        return self._get(param).layout

    def from_shape(self) -> list:
        """The names of the parameters whose role was read from their shape alone."""
        return [i.name for i in self.info.values() if i.reason == "shape"]


def _is_hf_conv1d(module: torch.nn.Module) -> bool:
    cls = type(module)
    return cls.__name__ == "Conv1D" and cls.__module__.startswith("transformers")


def _from_module(module: torch.nn.Module, pname: str, p: torch.Tensor) -> Optional[tuple]:
    """(role, layout, reason) of parameter `pname` of `module`, or None when the module says nothing."""
    reason = type(module).__name__
    if isinstance(module, _NORMS):
        return "vector", "torch", reason
    if p.ndim < 2 or pname.startswith("bias"):
        return "vector", "torch", reason
    if isinstance(module, (torch.nn.Embedding, torch.nn.EmbeddingBag)):
        return "embedding", "jax", reason
    if _is_hf_conv1d(module):
        return "matrix", "jax", reason
    if isinstance(module, _CONV_T):
        return "matrix", tuple(range(2, p.ndim)) + (0, 1), reason
    if isinstance(module, _TORCH_MATRICES) and (pname.startswith("weight") or pname == "in_proj_weight"):
        return "matrix", "torch", reason
    return None


def _from_name(name: str, p: torch.Tensor) -> tuple:
    low = name.lower()
    if p.ndim < 2 or "bias" in low.split(".")[-1] or "norm" in low or ".ln" in low or low.startswith("ln"):
        return "vector", "torch", "name"
    if any(key in low for key in ("embed", "wte", "wpe")):
        return "embedding", "jax", "name"
    return "matrix", "torch", "shape"


def module_roles(model: Union[torch.nn.Module, Iterable], *, strict_roles: bool = False,
                 stacklevel: int = 2) -> ModuleRoles:
    """Every parameter's role and layout, read from the module that holds it (module docstring).

    Args:
      model: an nn.Module, or an iterable of (name, parameter) pairs (`model.named_parameters()`).
      strict_roles: raise, instead of warning, when a parameter of ≥ 2 axes can only be read from
        its shape.
      stacklevel: the warning's stacklevel (2: the caller's line).

    Returns:
      A `ModuleRoles`.

    Raises:
      ValueError: with strict_roles, a parameter whose role comes from its shape alone (the
        message names them and how to state their roles).
      TypeError: neither a module nor (name, parameter) pairs.
    """
    info: dict = {}
    if isinstance(model, torch.nn.Module):
        readings: dict = {}  # id -> (first name, the parameter, [(role, layout, reason) per module holding it])
        for mname, module in model.named_modules(remove_duplicate=False):
            for pname, p in module.named_parameters(recurse=False, remove_duplicate=False):
                name = f"{mname}.{pname}" if mname else pname
                entry = readings.setdefault(id(p), (name, p, []))
                read = _from_module(module, pname, p)
                if read is not None:
                    entry[2].append(read)
        for key, (name, p, reads) in readings.items():
            embedding = [r for r in reads if r[0] == "embedding"]
            if embedding or reads:  # tied: read once, an embedding's reading first
                info[key] = ParamInfo(name, *(embedding or reads)[0])
            else:
                info[key] = ParamInfo(name, "vector", "torch", "rank < 2") if p.ndim < 2 else \
                    ParamInfo(name, "matrix", "torch", "shape")
    else:
        for entry in model:
            if not (isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[1], torch.Tensor)):
                raise TypeError("module_roles takes an nn.Module or its named_parameters() ((name, parameter) "
                                f"pairs), got an entry of type {type(entry).__name__}")
            name, p = entry
            if id(p) not in info:
                info[id(p)] = ParamInfo(name, *_from_name(name, p))
    roles = ModuleRoles(info)
    guessed = roles.from_shape()
    if guessed:
        msg = (f"lopt.torch read the role of {len(guessed)} parameter(s) from their shape alone, as a 'matrix' in "
               f"torch layout [out, in, *k]: {', '.join(guessed)}. If one is an embedding table, a bias-like "
               f"vector or stores [in, out], put it in its own parameter group with role=... and layout=... "
               f"(lopt.torch.param_roles)")
        if strict_roles:
            raise ValueError(msg + "; strict_roles=True makes this an error")
        warnings.warn(msg, RoleFromShapeWarning, stacklevel=stacklevel)
    return roles

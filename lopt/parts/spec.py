"""An architecture's written spec: its features in order, its named constants, its state layout.

Each architecture states its spec once, in its `spec()` method, derived from its config (the
number of decays, the LSTM's width, ...). Both implementations read it: the JAX update takes its
constants from it and orders its features by the names it lists, and `lopt.torch` builds each
parameter's state from its layout and writes every feature into the row its name has, so a
change on one side cannot silently break the other (`tests/lopt/parts/test_spec.py` checks the
layout against `init`'s state, the feature count against theta and torch's features against JAX's).

    spec = lopt.MLPLOpt().spec()
    spec.features            ("g", "p", "m_1", ..., "m_6", "sqrt_v", "g_over_sqrt_v", "m_0.9_over_sqrt_v")
    spec.constants["eps"]    1e-8
    spec.field("momenta").shape((48, 40))   (6, 48, 40)

State fields have one of three scopes:

- `PARAM`: one array per parameter leaf, shaped from the leaf's shape s (JAX layout): `dims + s`
  (elementwise, e.g. momenta `[K, *s]`), or `shape_of(s)` (e.g. factored moments, one scalar).
  JAX keeps a pytree like the params; torch one tensor per parameter, elementwise fields in the
  parameter's own (torch) layout, `shape_of` fields in the JAX layout.
- `TENSOR`: one array of shape `dims` per leaf; JAX stacks them, `[L, *dims]` (L leaves in the
  params' tree order); torch keeps one per parameter (e.g. an LSTM's h).
- `STEP`: one array of shape `dims` for the whole step (e.g. the loss EMA, the update count);
  torch keeps a copy in every parameter's state unless `torch_per_param` is False (the update
  count, which `lopt.torch` keeps as each parameter's "step").
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Optional, Sequence

PARAM, TENSOR, STEP = "param", "tensor", "step"
SCOPES = (PARAM, TENSOR, STEP)

__all__ = ["PARAM", "TENSOR", "STEP", "SCOPES", "StateField", "ArchSpec", "iteration_field", "reorder"]


@dataclasses.dataclass(frozen=True)
class StateField:
    """One entry of an architecture's optimizer state.

    Attributes:
      name: its name in the JAX state (a `NamedTuple` field, nested states read flat).
      scope: `PARAM`, `TENSOR` or `STEP` (module docstring).
      dims: `PARAM`: the axes before the parameter's own (elementwise fields); otherwise the shape.
      shape_of: for a `PARAM` field that is not elementwise: its shape from the leaf's JAX-layout shape.
      fill: the value of every element before the first update.
      dtype: "float32" (in torch: the compute dtype, float64 for float64 parameters) or "int32".
      torch_name: its key in a torch parameter's state where that differs from `name`.
      torch_per_param: whether a torch parameter's state holds it (False: `lopt.torch` keeps it itself).
      doc: what it holds.
    """
    name: str
    scope: str = PARAM
    dims: tuple[int, ...] = ()
    shape_of: Optional[Callable[[tuple[int, ...]], tuple[int, ...]]] = None
    fill: float = 0.0
    dtype: str = "float32"
    torch_name: Optional[str] = None
    torch_per_param: bool = True
    doc: str = ""

    def __post_init__(self):
        if self.scope not in SCOPES:
            raise ValueError(f"StateField {self.name!r}: scope must be one of {SCOPES}, got {self.scope!r}")
        if self.shape_of is not None and self.scope != PARAM:
            raise ValueError(f"StateField {self.name!r}: only a {PARAM!r} field has a shape_of")

    @property
    def elementwise(self) -> bool:
        """Whether it holds `dims` numbers per element of its parameter (shape dims + s)."""
        return self.scope == PARAM and self.shape_of is None

    @property
    def key(self) -> str:
        """Its key in a torch parameter's state: `torch_name`, else `name`."""
        return self.torch_name or self.name

    def shape(self, param_shape: Sequence[int] = ()) -> tuple[int, ...]:
        """Its shape for one leaf.

        Args:
          param_shape: the leaf's shape s in JAX layout (read by `PARAM` fields only).

        Returns:
          dims + s (elementwise), shape_of(s), or dims (`TENSOR`, `STEP`: per leaf / per step).
        """
        if self.scope != PARAM:
            return tuple(self.dims)
        if self.shape_of is not None:
            return tuple(self.shape_of(tuple(param_shape)))
        return tuple(self.dims) + tuple(param_shape)


@dataclasses.dataclass(frozen=True)
class ArchSpec:
    """What an architecture's two implementations (JAX, `lopt.torch`) share (module docstring).

    Attributes:
      name: the architecture's class name.
      features: the names of the features its first learned layer reads, in the order of that
        layer's rows (per parameter; per tensor for an architecture whose network reads only
        per-tensor statistics, NNAdam); () when it has none.
      constants: the numbers its update uses that are not config, by name (e.g. "eps", the ε
        added to a second moment before its square root).
      state: its optimizer state's fields (`StateField`), every leaf of `opt_fn(theta).init`'s
        state once.
    """
    name: str
    features: tuple[str, ...]
    constants: Mapping[str, Any]
    state: tuple[StateField, ...]

    def __post_init__(self):
        for what, names in (("feature", self.features), ("state field", [f.name for f in self.state])):
            dup = sorted({n for n in names if list(names).count(n) > 1})
            if dup:
                raise ValueError(f"{self.name}'s spec names the {what}s {dup} twice")

    @property
    def num_features(self) -> int:
        """F, the number of features."""
        return len(self.features)

    def feature_index(self, name: str) -> int:
        """The row of the feature `name` (ValueError naming the known features when absent)."""
        if name not in self.features:
            raise ValueError(f"{self.name} has no feature {name!r}; its features: {self.features}")
        return self.features.index(name)

    def field(self, name: str) -> StateField:
        """The state field `name` (ValueError naming the known fields when absent)."""
        for f in self.state:
            if f.name == name:
                return f
        raise ValueError(f"{self.name} has no state field {name!r}; its fields: {[f.name for f in self.state]}")


def iteration_field(name: str = "iteration") -> StateField:
    """The update count every stateful architecture keeps: int32 [], 0 before the first update
    (`lopt.torch` keeps it as each parameter's "step")."""
    return StateField(name, STEP, dtype="int32", torch_per_param=False, doc="the number of updates so far")


def reorder(values: Sequence[Any], names: Sequence[str], order: Sequence[str]) -> Any:
    """`values`, named `names`, in the order `order` (a spec's feature order).

    Args:
      values: a list, or an array whose first axis is indexed by `names`.
      names: the name of each value, in the order they come.
      order: the names in the order wanted (the same set).

    Returns:
      `values` itself when the orders agree; else the values reordered (a list, or the array
      gathered along its first axis).

    Raises:
      ValueError: the two name lists differ as sets.
    """
    names, order = tuple(names), tuple(order)
    if names == order:
        return values
    if sorted(names) != sorted(order):
        raise ValueError(f"the features computed {names} are not the spec's {order}")
    perm = [names.index(n) for n in order]
    if isinstance(values, list):
        return [values[i] for i in perm]
    return values[perm, ...]

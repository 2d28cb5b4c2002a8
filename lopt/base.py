"""LearnedOptimizer: meta-parameters theta -> an optax transform.

    theta = lo.init(key)                          # a pytree of arrays (dicts of arrays)
    tx = lo.opt_fn(theta, num_steps=None)         # optax.GradientTransformationExtraArgs
    opt_state = tx.init(params)
    updates, opt_state = tx.update(grads, opt_state, params, loss=loss)
    params = optax.apply_updates(params, updates)

`opt_fn` is pure in theta, so `jax.grad`/`jax.vmap` over theta work through whole unrolls.
Every `opt_fn` first checks theta against `theta_spec()` (tree structure and leaf shapes, at
trace time), so theta of another architecture or config is refused with the leaf that differs;
every `update` checks that the gradients have the params' tree and leaf shapes, naming the first
leaf that differs. Params: float32 or bfloat16 arrays (state float32, updates in each parameter's
dtype, also inside `lax.scan`); a plain Python float leaf is read as a float32 0-d array, as
`optax.apply_updates` does, and gets a float32 [] update. Complex, integer and float0 leaves are
refused naming the leaf (`lopt.parts.tree_checks.check_real_floating`: wrap complex parameters in
`optax.contrib.split_real_and_imaginary`, leave integer ones out with `optax.partition`).

Sharding and planning. Parameters sharded over a mesh get updates and state leaves sharded the
same way (`lopt.parts.layout`: explicit meshes always, automatic sharding with the "sharded"
layout). `tx.init` accepts `jax.ShapeDtypeStruct` params (a state that reads parameter values
then comes back as ShapeDtypeStructs), and `jax.eval_shape(tx.init, params)` gives every state
leaf's shape, dtype and sharding: use it for the state's partition specs. `optax.tree.map_params`
maps every per-parameter state tree, the momenta included, whose leaves are [K, *p.shape] (K
momenta stacked in front): a function given the parameter's spec must prepend None for them.

Hyper-parameters are declared once, as annotated class attributes with defaults, and every
subclass becomes a frozen dataclass of them (as flax's `nn.Module` does):

    class MyLOpt(LearnedOptimizer):
        hidden_size: int = 32
        decays: tuple[float, ...] = (0.9, 0.99)
        chunk_size: Optional[int] = speed_option(None)     # speed only: not in config(), not compared

        def check_config(self):                            # optional: refuse bad hyper-parameters
            if self.hidden_size < 1: raise ValueError(...)

The generated constructor takes the fields in order (`MyLOpt(16, decays=[0.5])`) and converts
each value to its declared type (int, float, bool, str, tuple[T, ...], Optional[T]), so a list
read back from JSON is a tuple again. From the fields the base class derives `config()` (the
JSON-able constructor arguments), equality and hashing by value (the class and the `config()`
fields, never object identity: safe as static jit arguments and cache keys), `repr`, and through
`config()` the theta files of `lopt.serialization`. A subclass that writes its own `__init__` is
left a plain class: it writes `config()` itself, and compares and hashes by its class and that.
"""
from __future__ import annotations

import dataclasses
import json
import operator
import types
import typing
from typing import Any, Callable, Optional

import jax
import optax

from lopt.parts import layout as layout_lib
from lopt.parts.tree_checks import tree_mismatch

Theta = Any

_ARCHITECTURES: dict[str, type] = {}
_THETA_SPECS: dict[Any, Any] = {}  # learned optimizer (hashed by value) -> theta's ShapeDtypeStructs
_CONVERTERS: dict[type, dict[str, Callable[[Any], Any]]] = {}  # class -> field name -> converter
_COMPARED: dict[type, Callable[[Any], tuple]] = {}  # class -> getter of (class, compared fields' values)
_IN_CONFIG = "lopt.in_config"  # field metadata: "always" (default), "never" or "unless_default"


def speed_option(default: Any) -> Any:
    """A constructor argument that changes speed, not the function theta defines.

    It is not part of `config()`, equality or the hash: two optimizers that differ only in it are
    equal (one jit compilation serves both, which is right as their updates agree) and a theta
    saved with one value loads into the other.

    Args:
      default: the argument's default value.

    Returns:
      A `dataclasses.field` to assign to the annotated class attribute.
    """
    return dataclasses.field(default=default, compare=False, metadata={_IN_CONFIG: "never"})


def layout_option() -> Any:
    """The `layout` option of an architecture whose per-parameter work is cut into blocks.

    Its value is an update layout (`lopt.parts.layout`): "cpu" (the default: blocks sized for a
    CPU's caches), "accelerator" (large blocks, whole-tensor sums), or an `UpdateLayout`. It is a
    `speed_option`: it changes speed and float32 rounding, not the function theta defines, so it
    is not part of `config()`, equality or the hash; `repr` shows it when it is not "cpu". It is
    a static value chosen when the optimizer is built: nothing reads the platform while an update
    is traced (`lopt.pretrained.load` resolves it from jax's default backend when it is called).

    Returns:
      A `dataclasses.field` to assign to an annotated `layout: Any` class attribute.
    """
    return speed_option("cpu")


def added_option(default: Any) -> Any:
    """A hyper-parameter added after theta files had been written without it.

    It is in `config()` only when it differs from `default`, so the configs of optimizers that do
    not use it, and the files and run records written before it existed, stay what they were; such
    a file rebuilds with `default`. It is compared and hashed like any hyper-parameter.

    Args:
      default: the value that reproduces the behaviour from before the option existed.

    Returns:
      A `dataclasses.field` to assign to the annotated class attribute.
    """
    return dataclasses.field(default=default, metadata={_IN_CONFIG: "unless_default"})


def _converter(tp: Any) -> Callable[[Any], Any]:
    """The function that converts a constructor argument to the field type `tp`; identity for other types."""
    if tp in (int, float, bool, str):
        return tp
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        item = _converter(args[0])
        return lambda x: tuple(item(v) for v in x)
    if origin is tuple and args:
        items = [_converter(a) for a in args]
        return lambda x: tuple(c(v) for c, v in zip(items, x, strict=True))
    if origin in (typing.Union, types.UnionType) and len(args) == 2 and type(None) in args:
        inner = _converter(next(a for a in args if a is not type(None)))
        return lambda x: None if x is None else inner(x)
    return lambda x: x


def _converters(cls: type) -> dict[str, Callable[[Any], Any]]:
    if cls not in _CONVERTERS:
        hints = typing.get_type_hints(cls)
        _CONVERTERS[cls] = {f.name: _converter(hints[f.name]) for f in dataclasses.fields(cls)}
    return _CONVERTERS[cls]


def _declares_fields(cls: type) -> bool:
    """Whether `cls` was made a dataclass of its fields (not a subclass with its own `__init__`)."""
    return "__dataclass_fields__" in vars(cls)


def _is_wrapper(cls: type) -> bool:
    """Whether `cls` only wraps its one parent under the parent's own name, as the subclass that
    `gin.external_configurable` makes does: not a new architecture."""
    return len(cls.__bases__) == 1 and all(
        getattr(cls, a) == getattr(cls.__bases__[0], a) for a in ("__module__", "__qualname__"))


def _to_json(value: Any) -> Any:
    return [_to_json(v) for v in value] if isinstance(value, tuple) else value


@typing.dataclass_transform(frozen_default=True, eq_default=False,
                            field_specifiers=(dataclasses.field, speed_option, layout_option, added_option))
class LearnedOptimizer:
    """Base class of learned optimizers (see the module docstring for the protocol).

    Subclasses declare their hyper-parameters as annotated fields and implement `init` and
    `opt_fn` (and, to refuse bad hyper-parameters, `check_config`); each subclass is registered
    by its class name (`architecture`), so saved thetas can rebuild it.
    """

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if _is_wrapper(cls):
            return
        _ARCHITECTURES[cls.__name__] = cls
        if "__init__" not in vars(cls):
            dataclasses.dataclass(frozen=True, eq=False, repr=False)(cls)

    def __post_init__(self) -> None:
        """Converts every field to its declared type, then runs `check_config`.

        Raises:
          TypeError: a value cannot be converted, or is not hashable.
          ValueError: from `check_config`.
        """
        for name, convert in _converters(type(self)).items():
            value = convert(getattr(self, name))
            try:
                hash(value)
            except TypeError:
                raise TypeError(f"{type(self).__name__}: {name}={value!r} is not hashable; declare the field as a "
                                f"tuple, number, bool or str") from None
            object.__setattr__(self, name, value)
        if "layout" in _converters(type(self)):
            layout_lib.resolve(self.layout)  # an unknown layout is refused here, naming the known ones
        self.check_config()

    def check_config(self) -> None:
        """Refuses bad hyper-parameters, called once by the constructor (fields already converted).

        Raises:
          ValueError: naming the hyper-parameter and the value that is not allowed.
        """

    def init(self, key: jax.Array) -> Theta:
        """Initial meta-parameters.

        Args:
          key: PRNG key.

        Returns:
          theta, a pytree of float32 arrays.
        """
        raise NotImplementedError

    def opt_fn(self, theta: Theta, *, num_steps: Optional[Any] = None,
               is_training: bool = False) -> optax.GradientTransformationExtraArgs:
        """The optimizer theta defines, as an optax transform.

        Call it as `update(grads, state, params, loss=loss)`: the learned architectures read
        `params` (and refuse to run without them); `loss=` is optional everywhere. Pure in theta:
        jax.grad and jax.vmap over theta work through whole unrolls.

        Args:
          theta: meta-parameters, as from `init`.
          num_steps: the training horizon N for progress features: an int or a scalar array, which
            may be traced (PES samples it per particle; `lopt.pretrained.load` and
            `optax.inject_hyperparams` pass it through); None: unknown, progress features are zero;
            architectures without them ignore it.
          is_training: True while meta-training (no architecture here changes behaviour with it).

        Returns:
          An `optax.GradientTransformationExtraArgs`.
        """
        raise NotImplementedError

    def config(self) -> dict:
        """The JSON-serialisable hyper-parameters: `type(self)(**self.config())` rebuilds self.

        Returns:
          {field name: value} for every field except speed options (`speed_option`) and added
          options (`added_option`) left at their default, tuples as lists.
        """
        if not _declares_fields(type(self)):
            raise NotImplementedError(f"{type(self).__name__} writes its own __init__, so it must write config()")
        out = {}
        for f in dataclasses.fields(self):
            value, rule = getattr(self, f.name), f.metadata.get(_IN_CONFIG, "always")
            if rule == "always" or (rule == "unless_default" and value != f.default):
                out[f.name] = _to_json(value)
        return out

    def theta_spec(self) -> Theta:
        """The shapes and dtypes of theta, `jax.eval_shape` of `init` (computed once per class and config).

        Returns:
          theta's pytree with `jax.ShapeDtypeStruct` leaves.
        """
        if self not in _THETA_SPECS:
            _THETA_SPECS[self] = jax.eval_shape(lambda: self.init(jax.random.key(0)))
        return _THETA_SPECS[self]

    def check_theta(self, theta: Theta, where: str = "opt_fn", *, check_dtypes: bool = False) -> None:
        """A clear error unless theta has this optimizer's tree structure and leaf shapes.

        Only shapes are compared, so it is free inside jit / vmap / grad (theta may be traced;
        under vmap each leaf has its unbatched shape).

        Args:
          theta: the meta-parameters to check.
          where: the caller, for the message (e.g. "MLPLOpt.opt_fn", "load_theta(PATH)").
          check_dtypes: also require `init`'s leaf dtypes (e.g. for a theta the outer optimizer will
            update; `opt_fn` leaves dtypes to the caller).

        Raises:
          ValueError: naming the first leaf that is missing, unexpected or of another shape.
        """
        mismatch = tree_mismatch(theta, self.theta_spec(), f"{self!r}'s theta", check_dtypes=check_dtypes)
        if mismatch is not None:
            raise ValueError(f"{where}: theta does not match the structure of {self!r}: {mismatch}. Was this "
                             f"theta saved from another architecture or config? lopt.load_learned_optimizer(path) "
                             f"rebuilds the architecture a theta file was saved from")

    @property
    def name(self) -> str:
        """The class name, e.g. "MLPLOpt"."""
        return type(self).__name__

    def _values(self) -> tuple:
        """What equality and the hash compare: the class and its compared fields' values (or the
        `config()` JSON of a subclass with its own `__init__`)."""
        cls = type(self)
        if not _declares_fields(cls):
            return (json.dumps(self.config(), sort_keys=True),)
        if cls not in _COMPARED:
            names = [f.name for f in dataclasses.fields(cls) if f.compare]
            _COMPARED[cls] = operator.attrgetter("__class__", *names) if names else lambda obj: (type(obj),)
        return _COMPARED[cls](self)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LearnedOptimizer):
            return NotImplemented
        return type(self) is type(other) and self._values() == other._values()

    def __hash__(self) -> int:
        return hash((type(self).__qualname__, self._values()))

    @property
    def update_layout(self) -> Any:
        """The `UpdateLayout` of this optimizer's `layout` option (`lopt.parts.layout.CPU` without one)."""
        return layout_lib.resolve(getattr(self, "layout", "cpu"))

    def __repr__(self) -> str:
        shown = dict(self.config())
        if getattr(self, "layout", "cpu") != "cpu":  # the update layout, a static choice worth seeing
            shown["layout"] = self.layout
        args = ", ".join(f"{k}={v!r}" for k, v in shown.items())
        return f"{type(self).__name__}({args})"


def architecture(name: str) -> type:
    """The LearnedOptimizer subclass registered under `name` (for rebuilding saved thetas).

    Args:
      name: a class name, as `LearnedOptimizer.name` gives it (e.g. "MLPLOpt").

    Returns:
      The class; `architecture(name)(**config)` rebuilds an optimizer from its `config()`.

    Raises:
      ValueError: no subclass of that name has been defined (imported); the message lists the known ones.
    """
    if name not in _ARCHITECTURES:
        raise ValueError(f"unknown learned-optimizer architecture {name!r}; known: {sorted(_ARCHITECTURES)}")
    return _ARCHITECTURES[name]


def architectures() -> list[str]:
    """The names of all registered LearnedOptimizer subclasses.

    Returns:
      The class names, sorted.
    """
    return sorted(_ARCHITECTURES)

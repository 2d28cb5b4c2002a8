"""The per-tensor interface: how a rule outside a learned update acts on quantities inside it.

A learned update such as `lopt.Celo2LOpt`'s computes, for each tensor p, a direction d (whose
learned part is a residual r) and a step size η of its own (learned, scheduled, per path):

    Δp = −η · (d(r) + λ · p)

Two deploy rules need those inner quantities: decoupled weight decay takes η of the tensor's own
path (`weight_decay.loss_aware_decay`), and the growth limit acts on the learned residual r alone
(`radial.growth_limited`). Instead of the architecture reading the rules' constants in a closure,
the learned update exposes the two places, and a rule wrapped around it reaches them per call:

- its transform is a `PerTensorTransform` (an `optax.GradientTransformationExtraArgs` that says
  it takes the interface), and
- its `update` reads the extra argument `tensor_rules=` (`EXTRA_ARG`): a tuple of `TensorRule`s,
  each of which may give a decay rate λ for a tensor (added to λ inside the bracket, so times the
  tensor's own η, in the architecture's order of operations) and may map the residual r.

A rule around any other optax transform has no η or r to read: it acts on the whole step instead
(each part's docstring says how). The wrappers forward the rules given to them, so parts nest:
`growth_limited(loss_aware_decay(tx, None, 0.03), 4.0)` reaches `tx`'s inner quantities with both.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import jax
import optax

__all__ = ["EXTRA_ARG", "TensorRule", "PerTensorTransform", "supports", "rules_of", "forward", "wrap"]

EXTRA_ARG = "tensor_rules"
"""The keyword under which `update` receives the tuple of `TensorRule`s (absent: none)."""


class TensorRule:
    """One rule's view of a learned update's per-tensor quantities; the base acts on none of them.

    A learned update calls, for each tensor p with role `role` (`lopt.param_roles.ParamRole`) and
    static shape `shape`, `decay(role)` and, on a tensor with a learned residual, `residual(...)`.
    Both run while the update is traced: return jax values, keep Python state out.
    """

    def decay(self, role: Any) -> Optional[jax.Array]:
        """The decay rate λ this rule adds for a tensor of `role` (inside the bracket, times its η).

        Args:
          role: the tensor's `lopt.param_roles.ParamRole`.

        Returns:
          float32 [] λ ≥ 0, or None for no decay on this tensor.
        """
        del role
        return None

    def residual(self, r: jax.Array, p: jax.Array, role: Any, shape: tuple) -> jax.Array:
        """The learned residual after this rule.

        Args:
          r: float32 [n] (or in p's shape): the residual of the tensor's direction.
          p: float32, the tensor, in r's layout.
          role: its `lopt.param_roles.ParamRole`.
          shape: its static shape.

        Returns:
          r's replacement, in r's shape and dtype (the base returns r).
        """
        del p, role, shape
        return r


class PerTensorTransform(optax.GradientTransformationExtraArgs):
    """An `optax.GradientTransformationExtraArgs` whose update takes `tensor_rules=` (module docstring).

    Build it as `PerTensorTransform(init_fn, update_fn)`; it is the optax pair otherwise.
    """
    __slots__ = ()


def supports(tx: Any) -> bool:
    """Whether `tx`'s update takes the interface (it is a `PerTensorTransform`)."""
    return isinstance(tx, PerTensorTransform)


def rules_of(extra_args: dict) -> tuple:
    """The `TensorRule`s an update was given.

    Args:
      extra_args: the update's keyword arguments.

    Returns:
      a tuple of `TensorRule` (empty when none was given).
    """
    return tuple(extra_args.get(EXTRA_ARG) or ())


def forward(inner: optax.GradientTransformationExtraArgs, rule: Optional[TensorRule],
            extra_args: dict) -> dict:
    """The extra args to call `inner.update` with: the given ones plus `rule` (innermost rule last).

    Args:
      inner: the wrapped transform.
      rule: this wrapper's rule, or None.
      extra_args: the wrapper's own extra args.

    Returns:
      a new dict; `EXTRA_ARG` holds the rules where `inner` takes them and is dropped elsewhere.
    """
    out = {k: v for k, v in extra_args.items() if k != EXTRA_ARG}
    if supports(inner):
        out[EXTRA_ARG] = rules_of(extra_args) + ((rule,) if rule is not None else ())
    return out


def wrap(inner: optax.GradientTransformationExtraArgs, init_fn: Callable,
         update_fn: Callable) -> optax.GradientTransformationExtraArgs:
    """The wrapper's transform: a `PerTensorTransform` where `inner` is one (so rules outside it reach
    `inner`'s quantities through it), else a plain `optax.GradientTransformationExtraArgs`.

    Args:
      inner: the wrapped transform.
      init_fn, update_fn: the wrapper's pair.

    Returns:
      the transform.
    """
    cls = PerTensorTransform if supports(inner) else optax.GradientTransformationExtraArgs
    return cls(init_fn, update_fn)

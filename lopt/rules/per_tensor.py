"""The per-tensor interface: how a rule outside a learned update acts on quantities inside it.

A learned update such as `lopt.Celo2LOpt`'s computes, for each tensor p, a direction d (whose
learned part is a residual r) and a step size η of its own (learned, scheduled, per path):

    Δp = −η · (d(r) + λ · p)

Deploy rules need those inner quantities: decoupled weight decay takes η of the tensor's own path
(`weight_decay.loss_aware_decay`); the step-size rules multiply η itself (`schedule.scheduled`,
`horizon.horizon_scaled`, `depth.depth_scaled`: the matrix path only); the horizon rule's fade and
the growth limit act on the learned residual r alone (`horizon.horizon_scaled`'s `residual_power`,
`radial.growth_limited`). Instead of the architecture reading the rules' constants in a closure, the
learned update exposes the three places, and a rule wrapped around it reaches them per call:

- its transform is a `PerTensorTransform` (an `optax.GradientTransformationExtraArgs` that says
  it takes the interface), and
- its `update` reads the extra argument `tensor_rules=` (`EXTRA_ARG`): a tuple of `TensorRule`s,
  each of which may give a factor on a tensor's step size η (`step_scale`), a decay rate λ for it
  (added to λ inside the bracket, so times the tensor's own η, in the architecture's order of
  operations) and may map the residual r.

The update applies the rules innermost first (the tuple is outermost first: `forward` appends each
wrapper's rule as the call goes inwards), so a chain [scheduled, horizon_scaled, depth_scaled]
computes η = ((η_learned · σ) · h) · d and the fade acts on r before the growth limit, in that order:

    η ← η · f_1 · f_2 ⋯           f_i = rule_i.step_scale(role, shape), innermost rule first
    r ← ρ_k(⋯ ρ_1(r))            ρ_i = rule_i.residual, innermost rule first
    λ ← λ + Σ_i rule_i.decay(role)

A rule around any other optax transform has no η or r to read: it acts on the whole step instead
(each part's docstring says how). The wrappers forward the rules given to them, so parts nest:
`growth_limited(loss_aware_decay(tx, None, 0.03), 4.0)` reaches `tx`'s inner quantities with both.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import optax

__all__ = ["EXTRA_ARG", "TensorRule", "PerTensorTransform", "supports", "rules_of", "innermost_first", "forward",
           "wrap", "scale_step_sizes"]

EXTRA_ARG = "tensor_rules"
"""The keyword under which `update` receives the tuple of `TensorRule`s (absent: none)."""


class TensorRule:
    """One rule's view of a learned update's per-tensor quantities; the base acts on none of them.

    A learned update calls, for each tensor p with role `role` (`lopt.param_roles.ParamRole`) and
    static shape `shape`, `decay(role)` and, on a tensor with a learned residual, `residual(...)`.
    Both run while the update is traced: return jax values, keep Python state out.
    """

    def step_scale(self, role: Any, shape: tuple) -> Optional[Any]:
        """The factor this rule puts on the step size η of a tensor of `role` and `shape`.

        Args:
          role: the tensor's `lopt.param_roles.ParamRole`.
          shape: its static shape.

        Returns:
          a float32 [] array or a Python float (> 0), or None for no factor (the base: None).
        """
        del role, shape
        return None

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


def innermost_first(extra_args: dict) -> tuple:
    """The `TensorRule`s an update was given, in the order it applies them: the innermost rule first.

    Args:
      extra_args: the update's keyword arguments.

    Returns:
      a tuple of `TensorRule` (empty when none was given).
    """
    return rules_of(extra_args)[::-1]


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


def scale_step_sizes(step_sizes: jax.Array, rules: tuple, roles: list, shapes: list, paths: list) -> tuple:
    """A learned update's step sizes times its rules' `step_scale` factors, innermost rule first.

    An update with P paths (Celo2LOpt: the orthogonalized matrices' η_matrix and the NAdamW η_adam)
    holds one step size per path, float32 [P]. A rule's factor that is the same value for every
    tensor of a path multiplies that path's entry: as a scalar when it is one value for all paths
    (schedule, horizon), else as a [P] vector (depth: [d, 1]), so the step sizes are computed once
    per step, as an architecture that held the factors as options computed them. A factor that
    differs between tensors of one path is returned per tensor instead.

    Args:
      step_sizes: float32 [P].
      rules: the `TensorRule`s, innermost first (`innermost_first`).
      roles: each tensor's `lopt.param_roles.ParamRole`.
      shapes: each tensor's static shape.
      paths: each tensor's path, an int in [0, P).

    Returns:
      (the scaled step sizes float32 [P], per tensor a tuple of the further factors its step size multiplies).
    """
    num, extra = int(step_sizes.shape[0]), [() for _ in roles]
    for rule in rules:
        factors = [rule.step_scale(r, tuple(s)) for r, s in zip(roles, shapes)]
        per_path = [[f for f, k in zip(factors, paths) if k == path] for path in range(num)]
        if not all(all(f is fs[0] for f in fs) for fs in per_path):  # varies within a path: per tensor
            extra = [e if f is None else (*e, f) for e, f in zip(extra, factors)]
            continue
        values = [fs[0] if fs else None for fs in per_path]
        if all(v is None for v in values):
            continue
        if all(v is values[0] for v in values):
            step_sizes = step_sizes * values[0]
        elif all(v is None or isinstance(v, (int, float)) for v in values):
            step_sizes = step_sizes * jnp.asarray([1.0 if v is None else v for v in values], jnp.float32)
        else:
            step_sizes = step_sizes * jnp.stack([jnp.asarray(1.0 if v is None else v, jnp.float32) for v in values])
    return step_sizes, extra

"""The wrapper the step-size rules share: any optax transform's updates times a factor.

    Δp_t = f(t, params) ⊙ u_t          u_t = inner.update(g_t, ...), t = updates made before this one

f gives one float32 scalar for the whole model or one per leaf. The rules built on it
(`schedule.scheduled`, `horizon.horizon_scaled`, `depth.depth_scaled`, `conv_step.conv_step_scaled`)
each choose f; the product is computed in float32 and cast back to each update's dtype.

Around a learned update that takes `lopt.rules.per_tensor`'s interface, a rule that gives `inside`
multiplies each tensor's own step size η instead (`StepScaleRule`): Δp = −(η · f) · (d + λ p), equal
to f ⊙ Δp in exact arithmetic, in the architecture's own order of operations (so a chain of these
rules reproduces, bit for bit, the same factors held as architecture options).
"""
from __future__ import annotations

import numbers
from typing import Any, Callable

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from lopt import param_roles
from lopt.rules import per_tensor

__all__ = ["ScaledState", "StepScaleRule", "scale_updates", "leaf_roles", "known"]


def known(value: Any) -> bool:
    """Whether a rule's constant is a Python or NumPy number (checked when the rule is built), not a jax
    value (e.g. a meta-parameter from theta, `lopt.rules.learned`, whose range its parametrisation bounds).

    Args:
      value: the constant.

    Returns:
      True for an int, float or NumPy scalar; False for a jax array or tracer.
    """
    return isinstance(value, (numbers.Real, np.generic))


@flax.struct.dataclass
class ScaledState:
    """A scaling rule's state around the wrapped optimizer's.

    Attributes:
      inner: the wrapped optimizer's state.
      count: int32 []: the updates made so far (t).
    """
    inner: Any
    count: jax.Array


class StepScaleRule(per_tensor.TensorRule):
    """A step-size rule given to a learned update (`lopt.rules.per_tensor`): a factor on each tensor's η,
    and optionally a factor on its learned residual.

    Args:
      scale_of: (role, shape) -> the factor on η (a float32 [] array or Python float), or None for none.
      residual_factor: a float32 [] factor on the learned residual r, or None (r unchanged).
    """

    def __init__(self, scale_of: Callable[[Any, tuple], Any], residual_factor: Any = None):
        self.scale_of, self.residual_factor = scale_of, residual_factor

    def step_scale(self, role, shape):
        """`scale_of(role, shape)`."""
        return self.scale_of(role, shape)

    def residual(self, r, p, role, shape):
        """`residual_factor · r` (r where it is None)."""
        return r if self.residual_factor is None else self.residual_factor * r


def scale_updates(inner: optax.GradientTransformation, factor: Callable[[jax.Array, Any], Any],
                  inside: Callable[[jax.Array, Any], per_tensor.TensorRule] = None
                  ) -> optax.GradientTransformationExtraArgs:
    """`inner` with its updates multiplied by `factor(t, params)` (or, inside a learned update, its step sizes).

    Args:
      inner: any optax transform (its update may read params and extra args such as `loss`).
      factor: (t int32 [], params or None) -> a float32 scalar, or a list with one scalar (or Python
        float) per leaf of the updates, in `jax.tree_util` order.
      inside: (t, params) -> the `lopt.rules.per_tensor.TensorRule` (e.g. a `StepScaleRule`) given to
        `inner` instead of scaling its updates, where `inner` takes that interface; None: always `factor`.

    Returns:
      An `optax.GradientTransformationExtraArgs` whose state is a `ScaledState` (a
      `lopt.rules.per_tensor.PerTensorTransform` that forwards `tensor_rules=` where `inner` is one).
    """
    inner = optax.with_extra_args_support(inner)

    def init_fn(params):
        return ScaledState(inner=inner.init(params), count=jnp.zeros((), jnp.int32))

    def update_fn(updates, state, params=None, **extra_args):
        if inside is not None and per_tensor.supports(inner):  # on each tensor's own step size
            rule = inside(state.count, params)
            steps, inner_state = inner.update(updates, state.inner, params, **per_tensor.forward(inner, rule, extra_args))
            return steps, ScaledState(inner=inner_state, count=state.count + 1)
        steps, inner_state = inner.update(updates, state.inner, params, **per_tensor.forward(inner, None, extra_args))
        leaves, treedef = jax.tree_util.tree_flatten(steps)
        f = factor(state.count, params)
        fs = f if isinstance(f, (list, tuple)) else [f] * len(leaves)
        out = [(jnp.asarray(c, jnp.float32) * jnp.asarray(s, jnp.float32)).astype(jnp.result_type(s))
               for c, s in zip(fs, leaves)]
        return treedef.unflatten(out), ScaledState(inner=inner_state, count=state.count + 1)

    return per_tensor.wrap(inner, init_fn, update_fn)


def leaf_roles(params: Any, weight_dimension_numbers: Any = None, rule: str = "this rule") -> list:
    """Every leaf's `lopt.param_roles.ParamRole`, in `jax.tree_util` order (static: paths and shapes only).

    Args:
      params: the parameters given to `update`.
      weight_dimension_numbers: roles where inference should not decide (`lopt.param_roles.infer`).
      rule: the rule's name, for the error.

    Returns:
      a list of ParamRole, one per leaf.

    Raises:
      ValueError: `params` is None.
    """
    if params is None:
        raise ValueError(f"{rule} reads the parameters' roles: pass params to update")
    roles = param_roles.infer(params, weight_dimension_numbers)
    return jax.tree_util.tree_structure(params).flatten_up_to(roles)

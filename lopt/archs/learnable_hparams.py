"""Hand-designed optimizers whose hyper-parameters are meta-learned.

theta holds unconstrained values: lr = exp(log_lr), β = sigmoid(logit_β), ε = exp(log_eps).
`opt_fn(theta)` is the plain optax optimizer with those values, so with theta at its
defaults it is numerically optax's own. As for every lopt optimizer (docs/drop_in_optax.md), it
runs in float32: the state is float32 and the updates come back in each parameter's dtype
(bfloat16 params keep bfloat16 updates and a float32 state, also inside `lax.scan`, where a
bfloat16 state promoted by the float32 β would change the carry's type).
"""
from __future__ import annotations

import math
from typing import Any, Optional

import jax
import jax.numpy as jnp
import optax

from lopt.parts import features as ft
from lopt.base import LearnedOptimizer
from lopt.parts.float32 import in_float32
from lopt.parts.nn import logit
from lopt.parts.spec import PARAM, ArchSpec, StateField, iteration_field


def _scalar(x: float) -> jax.Array:
    return jnp.asarray(x, jnp.float32)


class LearnableSGD(LearnedOptimizer):
    """SGD with a learned learning rate: Δp = −exp(θ_log_lr) g; theta = {"log_lr": float32 []}.

    Args:
      learning_rate: the initial learning rate (theta's default: log of it).
    """

    learning_rate: float = 1e-2

    def spec(self) -> ArchSpec:
        """Its spec (`lopt.parts.spec`): no features, no constants, no state (optax.sgd's)."""
        return ArchSpec("LearnableSGD", (), {}, ())

    def init(self, key: jax.Array) -> dict:
        del key
        return {"log_lr": _scalar(math.log(self.learning_rate))}

    def opt_fn(self, theta: dict, *, num_steps: Optional[Any] = None, is_training: bool = False):
        del num_steps, is_training
        self.check_theta(theta, "LearnableSGD.opt_fn")
        return in_float32(optax.sgd(jnp.exp(theta["log_lr"])), self.name)


class LearnableSGDM(LearnedOptimizer):
    """SGD with momentum (optax.sgd's: m ← μ m + g, Δp = −lr m), lr = exp(θ_log_lr) and
    μ = σ(θ_logit_momentum) learned; theta = {"log_lr", "logit_momentum"}, float32 [] each.

    Args:
      learning_rate: the initial learning rate.
      momentum: the initial momentum μ, in (0, 1).
    """

    learning_rate: float = 1e-2
    momentum: float = 0.9

    def spec(self) -> ArchSpec:
        """Its spec (`lopt.parts.spec`): no features or constants; state optax.trace's "trace" (like p)."""
        return ArchSpec("LearnableSGDM", (), {}, (StateField("trace", PARAM, doc="t ← g + μ t"),))

    def init(self, key: jax.Array) -> dict:
        del key
        return {"log_lr": _scalar(math.log(self.learning_rate)), "logit_momentum": _scalar(logit(self.momentum))}

    def opt_fn(self, theta: dict, *, num_steps: Optional[Any] = None, is_training: bool = False):
        del num_steps, is_training
        self.check_theta(theta, "LearnableSGDM.opt_fn")
        lr = jnp.exp(theta["log_lr"])
        mom = jax.nn.sigmoid(theta["logit_momentum"])
        return in_float32(optax.chain(optax.trace(decay=mom), optax.scale_by_learning_rate(lr)), self.name)


class LearnableAdam(LearnedOptimizer):
    """optax.adam with learned lr, β1, β2, ε: theta = {"log_lr", "logit_b1", "logit_b2", "log_eps"},
    float32 [] each (lr = exp(θ_log_lr), β = σ(θ_logit_β), ε = exp(θ_log_eps)).

    Args:
      learning_rate: the initial learning rate.
      b1: the initial β1, in (0, 1).
      b2: the initial β2, in (0, 1).
      eps: the initial ε (> 0).
    """

    learning_rate: float = 1e-3
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8

    def spec(self) -> ArchSpec:
        """Its spec (`lopt.parts.spec`): no features or constants; state optax.scale_by_adam's
        "count" (the update count), "mu" and "nu" (like p)."""
        return ArchSpec("LearnableAdam", (), {}, (iteration_field("count"), StateField("mu", PARAM, doc="m"),
                                                  StateField("nu", PARAM, doc="v")))

    def init(self, key: jax.Array) -> dict:
        del key
        return {"log_lr": _scalar(math.log(self.learning_rate)), "logit_b1": _scalar(logit(self.b1)),
                "logit_b2": _scalar(logit(self.b2)), "log_eps": _scalar(math.log(self.eps))}

    def opt_fn(self, theta: dict, *, num_steps: Optional[Any] = None, is_training: bool = False):
        del num_steps, is_training
        self.check_theta(theta, "LearnableAdam.opt_fn")
        return in_float32(optax.adam(
            learning_rate=jnp.exp(theta["log_lr"]), b1=jax.nn.sigmoid(theta["logit_b1"]),
            b2=jax.nn.sigmoid(theta["logit_b2"]), eps=jnp.exp(theta["log_eps"])), self.name)

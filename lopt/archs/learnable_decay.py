"""AdamW whose learning rate and weight decay are meta-learned: the smallest optimizer with a decay output.

theta = {"log_lr": float32 [], "weight_decay": float32 []}; with lr = exp(θ_log_lr) and λ = θ_weight_decay
(unconstrained and signed, so meta-training may learn to decay, to do nothing, or to grow the weights):

    m ← β1 m + (1 − β1) g,   v ← β2 v + (1 − β2) g²,   k the update count
    Δp = −lr · ( (m / (1 − β1^k)) / (√(v / (1 − β2^k) + ε_root) + ε)  +  λ p )

which is `optax.adamw(lr, b1, b2, eps, eps_root, weight_decay=λ)` with every parameter decayed. It is the
known-answer case of held-out meta-training (docs/heldout_meta_training.md): on a task that
over-fits, the held-out loss wants λ > 0 and the training loss wants λ ≤ 0. As every lopt
optimizer (docs/drop_in_optax.md) it runs in float32 (`lopt.parts.float32.in_float32`).
"""
from __future__ import annotations

import math
from typing import Any, Optional

import jax
import jax.numpy as jnp
import optax

from lopt.parts.float32 import in_float32
from lopt.base import LearnedOptimizer
from lopt.parts.spec import PARAM, ArchSpec, StateField, iteration_field


class LearnableAdamW(LearnedOptimizer):
    """AdamW with learned lr = exp(θ_log_lr) and signed decay λ = θ_weight_decay (the module docstring
    has the update); β1, β2, ε are fixed constants.

    Args:
      learning_rate: the initial learning rate (theta's default: log of it).
      weight_decay: the initial decay λ (0: plain Adam).
      b1: β1, in (0, 1).
      b2: β2, in (0, 1).
      eps: ε (> 0).
      eps_root: ε_root ≥ 0 added to v̂ inside the square root: √(v̂ + ε_root) (optax's `eps_root`). 0 is
        Adam's update; differentiating through the update (`jax.grad` over an inner run, TruncatedGrad,
        FullGrad) needs ε_root > 0 (e.g. 1e-12), since √v has an infinite derivative wherever a
        gradient entry is exactly 0 (a dead ReLU's weights), which makes the meta-gradient NaN.
    """

    learning_rate: float = 1e-3
    weight_decay: float = 0.0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    eps_root: float = 0.0

    def spec(self) -> ArchSpec:
        """Its spec (`lopt.parts.spec`): no features or constants; state optax.scale_by_adam's
        "count" (the update count), "mu" and "nu" (like p)."""
        return ArchSpec("LearnableAdamW", (), {}, (iteration_field("count"), StateField("mu", PARAM, doc="m"),
                                                   StateField("nu", PARAM, doc="v")))

    def init(self, key: jax.Array) -> dict:
        """theta at the constructor's values: {"log_lr": log lr, "weight_decay": λ}, float32 [] each."""
        del key
        return {"log_lr": jnp.asarray(math.log(self.learning_rate), jnp.float32),
                "weight_decay": jnp.asarray(self.weight_decay, jnp.float32)}

    def opt_fn(self, theta: dict, *, num_steps: Optional[Any] = None, is_training: bool = False):
        """`optax.adamw` at theta's lr and λ, decaying every parameter (run in float32)."""
        del num_steps, is_training
        self.check_theta(theta, "LearnableAdamW.opt_fn")
        tx = optax.adamw(learning_rate=jnp.exp(theta["log_lr"]), b1=self.b1, b2=self.b2, eps=self.eps,
                         eps_root=self.eps_root, weight_decay=theta["weight_decay"])
        return in_float32(tx, self.name)

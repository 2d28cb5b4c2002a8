"""GradientLearner: combines meta-gradient estimates and applies the outer optimizer to theta.

    state = learner.init(key)                               # LearnerState(theta, opt_state, step)
    state, metrics = learner.update(state, [est_1, ...], weights=None)

The combined gradient is Σ_i w_i ĝ_i / Σ_i w_i over the estimates whose gradient and loss are
all finite; the others are dropped and counted (`metrics["num_dropped"]`). If every estimate is
dropped, theta and the outer optimizer state are left unchanged.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import optax
from flax import struct

from lopt.base import LearnedOptimizer
from outer_trainers.estimators.gradient_estimator import Estimate
from outer_trainers.tree_utils import tree_all_finite


@struct.dataclass
class LearnerState:
    theta: Any
    opt_state: Any
    step: jax.Array  # int32 []: outer updates applied


def tree_norm(tree: Any) -> jax.Array:
    return optax.tree.norm(tree)


def _finite(est: Estimate) -> jax.Array:
    return tree_all_finite(est.grad) & jnp.isfinite(est.loss)


class GradientLearner:
    def __init__(self, learned_opt: LearnedOptimizer, outer_opt: optax.GradientTransformation,
                 theta_init: Optional[Any] = None):
        if not isinstance(learned_opt, LearnedOptimizer):
            raise TypeError(f"learned_opt must be a lopt.LearnedOptimizer, got {type(learned_opt).__name__}")
        self.learned_opt = learned_opt
        self.outer_opt = outer_opt
        self.theta_init = theta_init
        self._update = jax.jit(self._update_impl)

    def init(self, key: jax.Array) -> LearnerState:
        theta = self.learned_opt.init(key) if self.theta_init is None else self.theta_init
        return LearnerState(theta=theta, opt_state=self.outer_opt.init(theta), step=jnp.zeros((), jnp.int32))

    def update(self, state: LearnerState, estimates: Sequence[Estimate],
               weights: Optional[Sequence[float]] = None) -> tuple[LearnerState, dict]:
        estimates = list(estimates)
        if not estimates:
            raise ValueError("GradientLearner.update needs at least one Estimate")
        if weights is None:
            weights = [1.0] * len(estimates)
        if len(weights) != len(estimates):
            raise ValueError(f"{len(weights)} weights for {len(estimates)} estimates")
        return self._update(state, estimates, jnp.asarray(weights, jnp.float32))

    def _update_impl(self, state, estimates, weights):
        finite = jnp.stack([_finite(e) for e in estimates])
        w = jnp.where(finite, weights, 0.0)
        total = jnp.sum(w)
        denom = jnp.maximum(total, 1e-12)
        safe = lambda x, ok: jnp.where(ok, x, 0.0)
        grad = jax.tree_util.tree_map(
            lambda *gs: sum(wi * safe(g, ok) for wi, g, ok in zip(w, gs, finite)) / denom,
            *[e.grad for e in estimates])
        updates, opt_state = self.outer_opt.update(grad, state.opt_state, state.theta)
        theta = optax.apply_updates(state.theta, updates)
        apply = total > 0
        new = LearnerState(
            theta=jax.tree_util.tree_map(lambda a, b: jnp.where(apply, a, b), theta, state.theta),
            opt_state=jax.tree_util.tree_map(lambda a, b: jnp.where(apply, a, b), opt_state, state.opt_state),
            step=state.step + apply.astype(jnp.int32))
        losses = jnp.stack([safe(e.loss, ok) for e, ok in zip(estimates, finite)])
        metrics = {
            "meta_loss": jnp.sum(losses * w) / denom,
            "grad_norm": tree_norm(grad),
            "theta_norm": tree_norm(new.theta),
            "num_dropped": jnp.sum(~finite).astype(jnp.int32),
        }
        for i, e in enumerate(estimates):
            metrics[f"meta_loss/{i}"] = e.loss
            for k, v in e.metrics.items():
                metrics[f"{k}/{i}"] = v
        return new, metrics

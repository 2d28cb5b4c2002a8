"""GradientLearner: combines meta-gradient estimates and applies the outer optimizer to theta.

    state = learner.init(key)                               # LearnerState(theta, opt_state, step)
    state, metrics = learner.update(state, [est_1, ...], weights=None)

The combined gradient is Σ_i w_i ĝ_i / Σ_i w_i over the estimates whose gradient and loss are
all finite; the others are dropped and counted (`metrics["num_dropped"]`). If every estimate is
dropped, theta and the outer optimizer state are left unchanged. `metrics[PER_ESTIMATE]` holds
one dict per estimate, in the order of the estimates, for the caller to name (the outer loop
logs them under "<metric>/<estimator label>").
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import optax
from flax import struct

from lopt.base import LearnedOptimizer
from outer_trainers.estimators.gradient_estimator import Estimate
from outer_trainers.tree_utils import tree_all_finite, tree_where

PER_ESTIMATE = "per_estimate"


@struct.dataclass
class LearnerState:
    """What the learner owns: theta, the outer optimizer's state and the update count.

    Attributes:
        theta: the learned optimizer's meta-parameters (a pytree).
        opt_state: the outer optax transform's state for theta.
        step: int32 []: outer updates applied (steps whose estimates were all dropped don't count).
    """
    theta: Any
    opt_state: Any
    step: jax.Array


def _is_finite(est: Estimate) -> jax.Array:
    return tree_all_finite(est.grad) & jnp.isfinite(est.loss)


class GradientLearner:
    """Averages meta-gradient estimates, drops non-finite ones, and updates theta with an optax transform.

    With estimates (ĝ_i, L_i) and weights w_i, let m_i = 1 if ĝ_i and L_i are all finite, else 0,
    and W = Σ_i m_i w_i. One update is

        g = Σ_i m_i w_i ĝ_i / max(W, 1e-12)
        u, s' = outer_opt.update(g, s, theta);   theta' = theta + u        (only if W > 0)

    and the reported meta-loss is the same weighted average of the L_i. With W = 0 (every estimate
    dropped) theta, s and the step count stay as they are.

    Args:
        learned_opt: the LearnedOptimizer whose theta is meta-trained (`init(key)` draws theta).
        outer_opt: the optax transform applied to the combined meta-gradient (e.g. `optax.adam(1e-3)`).
        theta_init: a theta to start from instead of `learned_opt.init(key)` (e.g. a pretrained one).
    """

    def __init__(self, learned_opt: LearnedOptimizer, outer_opt: optax.GradientTransformation,
                 theta_init: Optional[Any] = None):
        if not isinstance(learned_opt, LearnedOptimizer):
            raise TypeError(f"learned_opt must be a lopt.LearnedOptimizer, got {type(learned_opt).__name__}")
        self.learned_opt = learned_opt
        self.outer_opt = outer_opt
        self.theta_init = theta_init
        self._update = jax.jit(self._update_impl)

    def init(self, key: jax.Array) -> LearnerState:
        """The initial state: theta (`theta_init`, else `learned_opt.init(key)`), the outer optimizer's state, step 0.

        Args:
            key: PRNG key for `learned_opt.init` (unused with `theta_init`).

        Returns:
            A LearnerState.
        """
        theta = self.learned_opt.init(key) if self.theta_init is None else self.theta_init
        return LearnerState(theta=theta, opt_state=self.outer_opt.init(theta), step=jnp.zeros((), jnp.int32))

    def update(self, state: LearnerState, estimates: Sequence[Estimate],
               weights: Optional[Sequence[float]] = None) -> tuple[LearnerState, dict]:
        """One outer update from the finite ones among `estimates` (see the class docstring for the math).

        Args:
            state: the current LearnerState.
            estimates: one or more Estimates at `state.theta` (gradients shaped like theta).
            weights: one non-negative weight per estimate (default: all 1).

        Returns:
            (new state, metrics): metrics holds float32/int32 [] arrays "meta_loss" (the weighted
            average over finite estimates), "grad_norm" (of the combined gradient), "theta_norm" (of
            the new theta) and "num_dropped" (estimates left out), and under PER_ESTIMATE a tuple with
            one dict per estimate: its "meta_loss" (the estimate's loss, finite or not) and its
            `Estimate.metrics`.
        """
        estimates = list(estimates)
        if not estimates:
            raise ValueError("GradientLearner.update needs at least one Estimate")
        if weights is None:
            weights = [1.0] * len(estimates)
        if len(weights) != len(estimates):
            raise ValueError(f"{len(weights)} weights for {len(estimates)} estimates")
        return self._update(state, estimates, jnp.asarray(weights, jnp.float32))

    def _update_impl(self, state, estimates, weights):
        finite = jnp.stack([_is_finite(e) for e in estimates])
        w = jnp.where(finite, weights, 0.0)
        total = jnp.sum(w)
        denom = jnp.maximum(total, 1e-12)
        zero_if_dropped = lambda x, ok: jnp.where(ok, x, 0.0)
        grad = jax.tree_util.tree_map(
            lambda *gs: sum(wi * zero_if_dropped(g, ok) for wi, g, ok in zip(w, gs, finite)) / denom,
            *[e.grad for e in estimates])
        updates, opt_state = self.outer_opt.update(grad, state.opt_state, state.theta)
        apply = total > 0
        new = LearnerState(theta=tree_where(apply, optax.apply_updates(state.theta, updates), state.theta),
                           opt_state=tree_where(apply, opt_state, state.opt_state),
                           step=state.step + apply.astype(jnp.int32))
        losses = jnp.stack([zero_if_dropped(e.loss, ok) for e, ok in zip(estimates, finite)])
        metrics = {
            "meta_loss": jnp.sum(losses * w) / denom,
            "grad_norm": optax.tree.norm(grad),
            "theta_norm": optax.tree.norm(new.theta),
            "num_dropped": jnp.sum(~finite).astype(jnp.int32),
            PER_ESTIMATE: tuple(dict({"meta_loss": e.loss}, **e.metrics) for e in estimates),
        }
        return new, metrics

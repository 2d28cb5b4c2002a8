"""GradientLearner: combines meta-gradient estimates and applies the outer optimizer to theta.

    state = learner.init(key)                               # LearnerState(theta, opt_state, step)
    state, metrics = learner.update(state, [est_1, ...], weights=None)

The combined gradient is Σ_i w_i ĝ_i / Σ_i w_i over the valid estimates: those whose gradient
and loss are all finite and that rest on at least one inner step (`Estimate.num_valid > 0`);
the others are dropped and counted (`metrics["num_dropped"]`). If every estimate is dropped,
theta and the outer optimizer state are left unchanged. `metrics[PER_ESTIMATE]` holds one dict
per estimate, in the order of the estimates, for the caller to name (the outer loop logs them
under "<metric>/<estimator label>").

Theta averaging (`theta_ema=d`, off by default): the state also carries an exponential moving
average of theta over the applied updates, θ̄_0 = θ_0 and θ̄_{t+1} = d·θ̄_t + (1 − d)·θ_{t+1}
(left as it is when a step applies nothing). It is what a run reports as its result
(`OuterTrainState.final_theta`): the last theta of a noisy outer optimization is one draw around
where it has settled, the average is its centre. An EMA rather than a Polyak average over the last
fraction of the run, because it needs no horizon: a resumed or extended run continues it as it is.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import optax
from flax import struct

from lopt.base import LearnedOptimizer
from outer_trainers.estimators.gradient_estimator import Estimate
from outer_trainers.validation import check_weights
from outer_trainers.runs.reporting import PER_ESTIMATE
from outer_trainers.tree_utils import tree_all_finite, tree_where



@struct.dataclass
class LearnerState:
    """What the learner owns: theta, the outer optimizer's state and the update count.

    Attributes:
        theta: the learned optimizer's meta-parameters (a pytree).
        opt_state: the outer optax transform's state for theta.
        step: int32 []: outer updates applied (steps whose estimates were all dropped don't count).
        theta_avg: the moving average of theta (`GradientLearner(theta_ema=...)`), or None without averaging
            (then the state, and so a checkpoint, holds exactly the leaves it held before averaging existed).
    """
    theta: Any
    opt_state: Any
    step: jax.Array
    theta_avg: Any = None


def is_valid(est: Estimate) -> jax.Array:
    """Whether an estimate may enter an update: finite gradient and loss, and at least one counted inner step.

    Args:
        est: the Estimate (`num_valid` None counts as "some steps counted").

    Returns:
        bool [].
    """
    finite = tree_all_finite(est.grad) & jnp.isfinite(est.loss)
    return finite if est.num_valid is None else finite & (est.num_valid > 0)


def nonfinite_fraction(num_valid: jax.Array, num_steps: jax.Array) -> jax.Array:
    """1 − num_valid / num_steps: the fraction of inner steps masked out of an estimate (0 for no steps).

    Args:
        num_valid: int [], the counted inner steps (`Estimate.num_valid`, or a sum of them).
        num_steps: int [], the inner steps that could have counted (`Estimate.num_steps`, or a sum).

    Returns:
        float32 [] in [0, 1].
    """
    steps = jnp.asarray(num_steps, jnp.float32)
    return jnp.where(steps > 0, 1.0 - jnp.asarray(num_valid, jnp.float32) / jnp.maximum(steps, 1.0), 0.0)


def _per_estimate(est: Estimate, valid: jax.Array) -> dict:
    out = {"meta_loss": est.loss, "dropped": (~valid).astype(jnp.int32)}
    if est.num_valid is not None and est.num_steps is not None:
        out["nonfinite_frac"] = nonfinite_fraction(est.num_valid, est.num_steps)
    return dict(out, **est.metrics)


class GradientLearner:
    """Averages meta-gradient estimates, drops invalid ones, and updates theta with an optax transform.

    With estimates (ĝ_i, L_i) and weights w_i, let m_i = 1 if ĝ_i and L_i are all finite and the
    estimate counted at least one inner step (`is_valid`), else 0, and W = Σ_i m_i w_i. One update is

        g = Σ_i m_i w_i ĝ_i / max(W, 1e-12)
        u, s' = outer_opt.update(g, s, theta);   theta' = theta + u        (only if W > 0)

    and the reported meta-loss is the same weighted average of the L_i. With W = 0 (every estimate
    dropped) theta, s and the step count stay as they are and the meta-loss is NaN: an estimate
    whose every inner step was masked out (e.g. non-finite) is never applied as a zero gradient.

    Args:
        learned_opt: the LearnedOptimizer whose theta is meta-trained (`init(key)` draws theta).
        outer_opt: the optax transform applied to the combined meta-gradient (e.g. `optax.adam(1e-3)`).
        theta_init: a theta to start from instead of `learned_opt.init(key)` (e.g. a pretrained one);
            it must have the structure, shapes and dtypes of `learned_opt.init`'s (checked here).
        theta_ema: the decay d in [0, 1) of the moving average of theta kept in the state (module
            docstring), e.g. 0.99 (an average over about 1 / (1 − d) = 100 updates); None: no average.
    """

    def __init__(self, learned_opt: LearnedOptimizer, outer_opt: optax.GradientTransformation,
                 theta_init: Optional[Any] = None, theta_ema: Optional[float] = None):
        if not isinstance(learned_opt, LearnedOptimizer):
            raise TypeError(f"learned_opt must be a lopt.LearnedOptimizer, got {type(learned_opt).__name__}")
        if theta_ema is not None:
            if isinstance(theta_ema, bool) or not isinstance(theta_ema, (int, float)) or not 0 <= theta_ema < 1:
                raise ValueError(f"theta_ema must be a decay in [0, 1) (e.g. 0.99) or None (no averaging), "
                                 f"got {theta_ema!r}")
            theta_ema = float(theta_ema)
        self.theta_ema = theta_ema
        if theta_init is not None:
            learned_opt.check_theta(theta_init, "GradientLearner(theta_init=...)", check_dtypes=True)
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
        theta_avg = None if self.theta_ema is None else jax.tree_util.tree_map(jnp.array, theta)
        return LearnerState(theta=theta, opt_state=self.outer_opt.init(theta), step=jnp.zeros((), jnp.int32),
                            theta_avg=theta_avg)

    def update(self, state: LearnerState, estimates: Sequence[Estimate],
               weights: Optional[Sequence[float]] = None) -> tuple[LearnerState, dict]:
        """One outer update from the valid ones among `estimates` (see the class docstring for the math).

        Args:
            state: the current LearnerState.
            estimates: one or more Estimates at `state.theta` (gradients shaped like theta).
            weights: one weight per estimate, finite and >= 0, not all 0 (default: all 1).

        Returns:
            (new state, metrics): metrics holds float32/int32 [] arrays "meta_loss" (the weighted
            average over valid estimates; NaN when none is applied), "grad_norm" (of the combined
            gradient), "theta_norm" (of the new theta), "num_dropped" (estimates left out) and, when
            some estimate reports its step counts, "nonfinite_frac" (the fraction of all their inner
            steps masked out); and under PER_ESTIMATE a tuple with one dict per estimate: its
            "meta_loss" (the estimate's loss, finite or not), "dropped" (int32 1 if it was left out),
            "nonfinite_frac" (when it reports `num_valid` and `num_steps`) and its `Estimate.metrics`.

        Raises:
            ValueError: no estimates, or weights of the wrong count, negative, non-finite or all 0.
        """
        estimates = list(estimates)
        if not estimates:
            raise ValueError("GradientLearner.update needs at least one Estimate")
        weights = check_weights(weights, len(estimates))
        return self._update(state, estimates, jnp.asarray(weights, jnp.float32))

    def _update_impl(self, state, estimates, weights):
        valid = jnp.stack([is_valid(e) for e in estimates])
        w = jnp.where(valid, weights, 0.0)
        total = jnp.sum(w)
        denom = jnp.maximum(total, 1e-12)
        zero_if_dropped = lambda x, ok: jnp.where(ok, x, 0.0)
        grad = jax.tree_util.tree_map(
            lambda *gs: sum(wi * zero_if_dropped(g, ok) for wi, g, ok in zip(w, gs, valid)) / denom,
            *[e.grad for e in estimates])
        updates, opt_state = self.outer_opt.update(grad, state.opt_state, state.theta)
        apply = total > 0
        theta = tree_where(apply, optax.apply_updates(state.theta, updates), state.theta)
        theta_avg = state.theta_avg
        if self.theta_ema is not None:
            d = self.theta_ema
            theta_avg = tree_where(apply, jax.tree_util.tree_map(lambda a, t: (d * a + (1.0 - d) * t).astype(a.dtype),
                                                                 state.theta_avg, theta), state.theta_avg)
        new = LearnerState(theta=theta, opt_state=tree_where(apply, opt_state, state.opt_state),
                           step=state.step + apply.astype(jnp.int32), theta_avg=theta_avg)
        losses = jnp.stack([zero_if_dropped(e.loss, ok) for e, ok in zip(estimates, valid)])
        metrics = {
            "meta_loss": jnp.where(apply, jnp.sum(losses * w) / denom, jnp.nan),
            "grad_norm": optax.tree.norm(grad),
            "theta_norm": optax.tree.norm(new.theta),
            "num_dropped": jnp.sum(~valid).astype(jnp.int32),
            PER_ESTIMATE: tuple(_per_estimate(e, ok) for e, ok in zip(estimates, valid)),
        }
        counted = [e for e in estimates if e.num_valid is not None and e.num_steps is not None]
        if counted:
            metrics["nonfinite_frac"] = nonfinite_fraction(sum(e.num_valid for e in counted),
                                                           sum(e.num_steps for e in counted))
        return new, metrics

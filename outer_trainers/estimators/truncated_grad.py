"""TruncatedGrad: truncated backprop through time (TBPTT) over `trunc_length` steps.

Each of N particles carries its inner state across truncations; the state at a truncation's
start is held fixed (stop_gradient), so per truncation with meta-losses ℓ_it and masks m_it:

    ĝ = mean_{i finite} ∇θ Σ_t m_it ℓ_it / K

Biased toward short horizons (it ignores θ's effect on the carried state). Gradients are
taken per particle (vmap of grad), so a particle whose gradient is non-finite is dropped from
the mean and counted in `metrics["nonfinite_grads"]` instead of poisoning the estimate; its
steps do not count in `Estimate.num_valid`, so an estimate that kept no particle is dropped too.
`remat=True` wraps each inner step in `jax.checkpoint` (recompute instead of storing).
"""
from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
from flax import struct

from outer_trainers.estimators.gradient_estimator import TruncatedEstimator, counted_estimate
from outer_trainers.tree_utils import masked_mean, tree_all_finite, tree_weighted_sum
from outer_trainers.steps.truncated_step import TruncatedStep


@struct.dataclass
class TruncatedGradState:
    """TruncatedGrad's state between truncations.

    Attributes:
        inner_state: the N particles' states, leaves [N, ...].
    """

    inner_state: object


def particle_step_fn(ts: TruncatedStep, outer_state, data, remat: bool):
    """`ts.step` of one particle as a function (θ, state, key) -> (state, StepOut).

    Args:
        ts: the TruncatedStep.
        outer_state: the outer iteration or None.
        data: the arrays of `ts.data_args()` as passed through jit, or None.
        remat: wrap the step in `jax.checkpoint` (recompute it on the backward pass).

    Returns:
        The step function.
    """
    step = lambda th, s, k: ts.step(th, s, k, outer_state=outer_state, data=data)
    return jax.checkpoint(step) if remat else step


def mean_finite_grads(grads, losses: jax.Array, counted: Optional[jax.Array] = None):
    """The mean over particles of the per-particle gradients whose gradient and loss are finite.

    Args:
        grads: θ-shaped gradients with a leading [N] axis.
        losses: float [N], the particles' losses.
        counted: bool [N], particles that may enter the mean at all (e.g. those with a counted step),
            or None for all. A particle left out here is not counted as dropped.

    Returns:
        (mean grad, number of particles dropped for a non-finite gradient or loss as int32 [], bool [N]
        the particles kept in the mean); the mean is 0 if none is kept.
    """
    finite = jax.vmap(tree_all_finite)(grads) & jnp.isfinite(losses)
    ok = finite if counted is None else finite & counted
    denom = jnp.maximum(jnp.sum(ok), 1).astype(jnp.float32)
    w = ok.astype(jnp.float32) / denom
    kept = jax.tree_util.tree_map(lambda g: jnp.where(jnp.reshape(ok, ok.shape + (1,) * (g.ndim - 1)), g, 0.0),
                                  grads)
    return tree_weighted_sum(w, kept), jnp.sum(~finite), ok


class TruncatedGrad(TruncatedEstimator):
    """Truncated backprop through time (biased toward short horizons; see the module docstring).

    Args:
        truncated_step: the unrolled system; a particle is one of its states.
        num_tasks: N, the number of particles the estimate averages over.
        trunc_length: K, the steps backpropagated through per truncation (one `estimate`).
        random_initial_iteration_offset: staggers the particles' first episodes (see `TruncatedEstimator`).
        remat: wrap each step in `jax.checkpoint` (recompute instead of storing; same result).
        compiler_options: XLA compile options (see `GradientEstimator`).
    """

    def __init__(self, truncated_step: TruncatedStep, num_tasks: int, trunc_length: int, *,
                 random_initial_iteration_offset: int = 0, remat: bool = False,
                 compiler_options: Optional[dict] = None):
        self.remat = bool(remat)
        super().__init__(truncated_step, num_tasks, trunc_length,
                         random_initial_iteration_offset=random_initial_iteration_offset,
                         compiler_options=compiler_options)

    def _init_state(self, theta, key, outer_state, data):
        return TruncatedGradState(self._init_particles(theta, key, outer_state, data))

    def _estimate(self, theta, state, key, outer_state, data):
        """Particle i's step t uses key fold_in(split(key, N)[i], t)."""
        K = self.trunc_length
        step = particle_step_fn(self.truncated_step, outer_state, data, self.remat)

        def particle_loss(th, s, pkey):
            s = jax.lax.stop_gradient(s)
            s, out = jax.lax.scan(lambda s, t: step(th, s, jax.random.fold_in(pkey, t)), s, jnp.arange(K))
            return jnp.sum(jnp.where(out.mask, out.loss, 0.0)) / K, (s, out)

        grads, (states, out) = jax.vmap(jax.grad(particle_loss, has_aux=True), in_axes=(None, 0, 0))(
            theta, state.inner_state, jax.random.split(key, self.num_tasks))
        losses = jnp.sum(jnp.where(out.mask, out.loss, 0.0), axis=1) / K
        grad, dropped, kept = mean_finite_grads(grads, losses)
        metrics = {"nonfinite": jnp.sum(jnp.asarray(out.metrics.get("nonfinite", 0))),
                   "resets": jnp.sum(out.is_done), "nonfinite_grads": dropped}
        counted = out.mask & kept[:, None]  # a particle's steps enter the estimate only with its gradient
        estimate = counted_estimate(grad, masked_mean(out.loss, out.mask), jnp.sum(counted), out.mask.size, metrics)
        return TruncatedGradState(states), estimate

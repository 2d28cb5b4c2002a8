"""TruncatedGrad: truncated backprop through time (TBPTT) over `trunc_length` steps.

Each of N particles carries its inner state across truncations; the state at a truncation's
start is held fixed (stop_gradient), so per truncation with meta-losses ℓ_it and masks m_it:

    ĝ = mean_{i finite} ∇θ Σ_t m_it ℓ_it / K

Biased toward short horizons (it ignores θ's effect on the carried state). Gradients are
taken per particle (vmap of grad), so a particle whose gradient is non-finite is dropped from
the mean and counted in `metrics["nonfinite_grads"]` instead of poisoning the estimate.
`remat=True` wraps each inner step in `jax.checkpoint` (recompute instead of storing).
"""
from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
from flax import struct

from outer_trainers import unroll as U
from outer_trainers.tree_utils import masked_mean, tree_all_finite
from outer_trainers.estimators.gradient_estimator import Estimate, TruncatedEstimator
from outer_trainers.truncated_step import TruncatedStep


@struct.dataclass
class TruncatedGradState:
    inner_state: object  # [N] particles


def particle_step_fn(ts: TruncatedStep, outer_state, data, remat: bool):
    """step(θ, state, key) of one particle, optionally rematerialised."""
    step = lambda th, s, k: ts.step(th, s, k, outer_state=outer_state, data=data)
    return jax.checkpoint(step) if remat else step


def mean_finite_grads(grads, losses: jax.Array):
    """Mean over particles of per-particle grads [N, ...] whose grad and loss are finite.
    Returns (mean grad, number of dropped particles)."""
    ok = jax.vmap(tree_all_finite)(grads) & jnp.isfinite(losses)
    denom = jnp.maximum(jnp.sum(ok), 1).astype(jnp.float32)
    w = ok.astype(jnp.float32) / denom
    mean = jax.tree_util.tree_map(lambda g: jnp.tensordot(w, jnp.where(
        jnp.reshape(ok, ok.shape + (1,) * (g.ndim - 1)), g, 0.0), axes=1), grads)
    return mean, jnp.sum(~ok)


class TruncatedGrad(TruncatedEstimator):
    """TBPTT with `num_tasks` particles and truncations of `trunc_length` steps (`std` unused:
    accepted so every estimator shares one constructor signature)."""

    antithetic = False

    def __init__(self, truncated_step: TruncatedStep, num_tasks: int, trunc_length: int, std: float = 0.0,
                 random_initial_iteration_offset: int = 0, remat: bool = False, *,
                 compiler_options: Optional[dict] = None):
        self.remat = bool(remat)
        super().__init__(truncated_step, num_tasks, trunc_length, std, random_initial_iteration_offset,
                         compiler_options=compiler_options)

    def _init_state(self, theta, key, outer_state, data):
        return TruncatedGradState(self._init_particles(theta, key, outer_state, data))

    def _estimate(self, theta, state, key, outer_state, data):
        """Particle i's step t uses key fold_in(split(key, N)[i], t)."""
        K = self.trunc_length
        step = particle_step_fn(self.truncated_step, outer_state, data, self.remat)

        def particle_loss(th, s, pkey):
            s = jax.lax.stop_gradient(s)

            def body(s, t):
                s, out = step(th, s, jax.random.fold_in(pkey, t))
                return s, out

            s, out = jax.lax.scan(body, s, jnp.arange(K))
            return jnp.sum(jnp.where(out.mask, out.loss, 0.0)) / K, (s, out)

        grads, (states, out) = jax.vmap(jax.grad(particle_loss, has_aux=True), in_axes=(None, 0, 0))(
            theta, state.inner_state, jax.random.split(key, self.num_tasks))
        losses = jnp.sum(jnp.where(out.mask, out.loss, 0.0), axis=1) / K
        grad, dropped = mean_finite_grads(grads, losses)
        metrics = {"nonfinite": jnp.sum(jnp.asarray(out.metrics.get("nonfinite", 0))),
                   "resets": jnp.sum(out.is_done), "nonfinite_grads": dropped}
        return TruncatedGradState(states), Estimate(grad, masked_mean(out.loss, out.mask), metrics)

"""NoiseReuseES (NRES): online ES that reuses one perturbation per episode (Li et al., NeurIPS 2023).

Particle i draws ε_i ~ N(0, σ²I) when its episode starts and keeps it for every truncation of
that episode; its ± inner states run with θ ± ε_i. Per truncation of K steps with meta-losses ℓ±_it:

    ĝ = mean_i Σ_t (ℓ⁺_it − ℓ⁻_it) · ε_it / (2σ² K)

where ε_it is the perturbation in force at step t. When an episode ends at step t (the step's
loss still belongs to the old episode, so it is paired with the old ε) the particle draws a
fresh ε for its new episode, and the remaining steps of the truncation — and later truncations —
are paired with the fresh one. So resets inside a truncation are exact, not approximated.
Unbiased for the gradient of the Gaussian-smoothed mean loss of the truncation's steps; unlike
PES its variance does not grow with the number of truncations an episode has run.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from outer_trainers import unroll as U
from outer_trainers.estimators.gradient_estimator import Estimate, TruncatedEstimator
from outer_trainers.tree_utils import tree_where


@struct.dataclass
class NRESState:
    inner_state: object  # [2N] particles: + half then − half
    eps: object  # theta-shaped with leading [N]: each particle's perturbation for its current episode


def _weighted_sum(w: jax.Array, tree: object) -> object:
    """Σ_i w_i x_i over the leading axis of every leaf: w [N], leaves [N, ...] -> [...]."""
    return jax.tree_util.tree_map(lambda x: jnp.tensordot(w, x, axes=1), tree)


class NoiseReuseES(TruncatedEstimator):
    """NRES with `num_tasks` antithetic particle pairs and truncations of `trunc_length` steps."""

    def _init_state(self, theta, key, outer_state, data):
        k_particles, k_eps = jax.random.split(key)
        particles = self._init_particles(theta, k_particles, outer_state, data)
        return NRESState(U.tile(particles, 2), U.sample_perturbations(theta, k_eps, self.num_tasks, self.std))

    def _estimate(self, theta, state, key, outer_state, data):
        n, K, std = self.num_tasks, self.trunc_length, self.std
        k_unroll, k_fresh = jax.random.split(key)
        ts = self.truncated_step

        def flush(args):
            # Episodes that just ended: bank w·ε of the old perturbation, draw a fresh one.
            done, t, eps, w, g = args
            g = jax.tree_util.tree_map(jnp.add, g, _weighted_sum(jnp.where(done, w, 0.0), eps))
            fresh = U.sample_perturbations(theta, jax.random.fold_in(k_fresh, t), n, std)
            return tree_where(done, fresh, eps), jnp.where(done, 0.0, w), g

        def body(carry, xs):
            states, eps, w, g = carry  # w [N]: Σ of loss differences paired with the current ε
            keys, t = xs
            states, out = ts.batched_step(U.tree_stack_pm(theta, eps), states, jnp.concatenate([keys, keys], axis=0),
                                          outer_state=outer_state, data=data, reset_groups=2)
            valid = out.mask[:n] & out.mask[n:]
            w = w + jnp.where(valid, out.loss[:n] - out.loss[n:], 0.0)
            done = out.is_done[:n] | out.is_done[n:]
            eps, w, g = jax.lax.cond(jnp.any(done), flush, lambda a: a[2:], (done, t, eps, w, g))
            nonfinite = jnp.sum(jnp.asarray(out.metrics.get("nonfinite", 0)))
            return (states, eps, w, g), (jnp.sum(jnp.where(out.mask, out.loss, 0.0)), jnp.sum(out.mask), jnp.sum(done), nonfinite)

        g0 = jax.tree_util.tree_map(jnp.zeros_like, theta)
        carry = (state.inner_state, state.eps, jnp.zeros((n,), jnp.float32), g0)
        (states, eps, w, g), (loss_sum, count, resets, nonfinite) = jax.lax.scan(
            body, carry, (U.step_keys(k_unroll, K, n), jnp.arange(K)))
        c = 1.0 / (2 * std**2 * K * n)
        grad = jax.tree_util.tree_map(lambda a, b: (a + b) * c, g, _weighted_sum(w, eps))
        loss = jnp.sum(loss_sum) / jnp.maximum(jnp.sum(count), 1.0)
        metrics = {"nonfinite": jnp.sum(nonfinite), "resets": jnp.sum(resets)}
        return NRESState(states, eps), Estimate(grad, loss, metrics)

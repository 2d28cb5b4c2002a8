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

from outer_trainers.steps import unroll as U
from outer_trainers.estimators import antithetic as A
from outer_trainers.estimators.gradient_estimator import AntitheticTruncatedEstimator, counted_estimate
from outer_trainers.tree_utils import tree_weighted_sum, tree_where


@struct.dataclass
class NRESState:
    """NoiseReuseES's state between truncations.

    Attributes:
        inner_state: the 2N particles' states, leaves [2N, ...]: the + halves, then the − halves.
        eps: each pair's perturbation ε_i for its current episode, θ-shaped with a leading [N] axis.
    """

    inner_state: object
    eps: object


class NoiseReuseES(AntitheticTruncatedEstimator):
    """Noise-reuse ES: one perturbation per pair and episode (see the module docstring).

    Args:
        truncated_step: the unrolled system; each pair carries a + and a − state of it.
        num_tasks: N, the number of ± pairs, each with the perturbation ε_i of its episode.
        trunc_length: K, the steps of one truncation (one `estimate`).
        std: σ of the perturbations, drawn when a pair's episode starts.
        random_initial_iteration_offset: staggers the pairs' first episodes (see `TruncatedEstimator`).
        compiler_options: XLA compile options (see `GradientEstimator`).
    """

    def _init_state(self, theta, key, outer_state, data):
        k_particles, k_eps = jax.random.split(key)
        particles = self._init_particles(theta, k_particles, outer_state, data)
        return NRESState(U.tile(particles, 2), A.sample_perturbations(theta, k_eps, self.num_tasks, self.std))

    def _estimate(self, theta, state, key, outer_state, data):
        n, K, std = self.num_tasks, self.trunc_length, self.std
        k_unroll, k_fresh = jax.random.split(key)
        ts = self.truncated_step

        def flush(args):
            # Episodes that just ended: bank w·ε of the old perturbation, draw a fresh one.
            done, t, eps, w, g = args
            g = jax.tree_util.tree_map(jnp.add, g, tree_weighted_sum(jnp.where(done, w, 0.0), eps))
            fresh = A.sample_perturbations(theta, jax.random.fold_in(k_fresh, t), n, std)
            return tree_where(done, fresh, eps), jnp.where(done, 0.0, w), g

        def body(carry, xs):
            states, eps, w, g = carry  # w [N]: Σ of loss differences paired with the current ε
            keys, t = xs
            states, out = ts.batched_step(A.tree_stack_pm(theta, eps), states, U.tile(keys, 2),
                                          outer_state=outer_state, data=data, reset_groups=2)
            w = w + A.pair_loss_diff(out.loss, out.mask)
            done = A.pair_is_done(out.is_done)
            eps, w, g = jax.lax.cond(jnp.any(done), flush, lambda a: a[2:], (done, t, eps, w, g))
            nonfinite = jnp.sum(jnp.asarray(out.metrics.get("nonfinite", 0)))
            stats = (jnp.sum(jnp.where(out.mask, out.loss, 0.0)), jnp.sum(out.mask), jnp.sum(done), nonfinite,
                     A.counted_steps(out.mask))
            return (states, eps, w, g), stats

        g0 = jax.tree_util.tree_map(jnp.zeros_like, theta)
        carry = (state.inner_state, state.eps, jnp.zeros((n,), jnp.float32), g0)
        (states, eps, w, g), (loss_sum, count, resets, nonfinite, counted) = jax.lax.scan(
            body, carry, (U.step_keys(k_unroll, K, n), jnp.arange(K)))
        c = 1.0 / (2 * std**2 * K * n)
        grad = jax.tree_util.tree_map(lambda a, b: (a + b) * c, g, tree_weighted_sum(w, eps))
        loss = jnp.sum(loss_sum) / jnp.maximum(jnp.sum(count), 1.0)
        metrics = {"nonfinite": jnp.sum(nonfinite), "resets": jnp.sum(resets)}
        return NRESState(states, eps), counted_estimate(grad, loss, jnp.sum(counted), 2 * n * K, metrics)

"""TruncatedPES: persistent evolution strategies (Vicol, Metz, Sohl-Dickstein, ICML 2021).

Each particle i keeps ξ_i, the sum of the perturbations applied since its episode began, and
separate + and − inner states. Per truncation with fresh ε_i and K steps of meta-losses ℓ±_it:

    ĝ = mean_i Σ_t (ℓ⁺_it − ℓ⁻_it) · a_it / (2σ² K),
    a_it = ξ_i + ε_i   if the episode has not reset before step t in this truncation,
         = ε_i         otherwise (the new episode has seen only ε_i).

Afterwards ξ_i ← ξ_i + ε_i with no reset, ε_i after a reset inside the truncation, and 0 when the
reset came with the truncation's last step. The estimate is unbiased for the gradient of the
Gaussian-smoothed loss of the whole episode's steps in this truncation.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from outer_trainers import unroll as U
from outer_trainers.gradient_estimator import Estimate, GradientEstimator
from outer_trainers.truncated_es import _check
from outer_trainers.truncated_step import TruncatedStep


@struct.dataclass
class PESState:
    inner_state: object  # [2N] particles: + half then − half
    accumulator: object  # theta-shaped with leading [N]: ξ


def pes_weights(diff: jax.Array, done: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """From per-step loss differences `diff` [K, N] and resets `done` [K, N], the coefficients
    of ε and ξ in Σ_t diff_t a_t, and the keep-factors of ε and ξ in the new accumulator."""
    reset_before = (jnp.cumsum(done, axis=0) - done) > 0
    w_eps = diff.sum(0)
    w_acc = jnp.where(reset_before, 0.0, diff).sum(0)
    keep_eps = (~done[-1]).astype(diff.dtype)
    keep_acc = (~jnp.any(done, axis=0)).astype(diff.dtype)
    return w_eps, w_acc, keep_eps, keep_acc


class TruncatedPES(GradientEstimator):
    def __init__(self, truncated_step: TruncatedStep, num_tasks: int, trunc_length: int, std: float = 0.01,
                 random_initial_iteration_offset: int = 0):
        _check(num_tasks, trunc_length, std)
        self.num_tasks, self.trunc_length, self.std = int(num_tasks), int(trunc_length), float(std)
        self.random_initial_iteration_offset = int(random_initial_iteration_offset)
        self.name = f"TruncatedPES(n={num_tasks},K={trunc_length})"
        super().__init__(truncated_step)

    @property
    def inner_steps_per_estimate(self) -> int:
        return 2 * self.num_tasks * self.trunc_length

    def _init_state(self, theta, key, outer_state, data):
        particles = U.init_particles(self.truncated_step, theta, key, self.num_tasks, outer_state=outer_state,
                                     data=data, max_offset=self.random_initial_iteration_offset)
        acc = jax.tree_util.tree_map(lambda t: jnp.zeros((self.num_tasks,) + jnp.shape(t), jnp.result_type(t)), theta)
        return PESState(U.tile(particles, 2), acc)

    def _estimate(self, theta, state, key, outer_state, data):
        k_eps, k_unroll = jax.random.split(key)
        n, K = self.num_tasks, self.trunc_length
        eps = U.sample_perturbations(theta, k_eps, n, self.std)
        states, out = U.unroll(self.truncated_step, U.tree_stack_pm(theta, eps), state.inner_state, k_unroll, K,
                               key_groups=2, outer_state=outer_state, data=data)
        valid = out.mask[:, :n] & out.mask[:, n:]
        diff = jnp.where(valid, out.loss[:, :n] - out.loss[:, n:], 0.0)
        done = out.is_done[:, :n] | out.is_done[:, n:]
        w_eps, w_acc, keep_eps, keep_acc = pes_weights(diff, done)
        c = 1.0 / (2 * self.std**2 * K * n)
        grad = jax.tree_util.tree_map(
            lambda e, a: jnp.tensordot(w_eps * c, e, axes=1) + jnp.tensordot(w_acc * c, a, axes=1),
            eps, state.accumulator)
        bshape = lambda w, x: jnp.reshape(w, w.shape + (1,) * (x.ndim - 1))
        acc = jax.tree_util.tree_map(lambda e, a: bshape(keep_eps, e) * e + bshape(keep_acc, a) * a,
                                     eps, state.accumulator)
        metrics = {"nonfinite": jnp.sum(out.metrics.get("nonfinite", 0)), "resets": jnp.sum(done)}
        return PESState(states, acc), Estimate(grad, U.masked_mean(out.loss, out.mask), metrics)

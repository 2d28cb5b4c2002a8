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
from outer_trainers.estimators.gradient_estimator import Estimate, TruncatedEstimator


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


def pes_update(out, eps, acc, std: float, num_total: int):
    """PES from one truncation's StepOut (leaves [K, 2M]: + half then − half) of M particle pairs.

    Returns (Σ over these pairs of the gradient terms, each divided by 2σ²·K·num_total, so summing
    over shards of the N = num_total pairs gives the estimate; the new accumulator ξ [M];
    the summed statistics [masked loss sum, valid count, nonfinite, resets]).
    """
    K, m = out.loss.shape[0], out.loss.shape[1] // 2
    valid = out.mask[:, :m] & out.mask[:, m:]
    diff = jnp.where(valid, out.loss[:, :m] - out.loss[:, m:], 0.0)
    done = out.is_done[:, :m] | out.is_done[:, m:]
    w_eps, w_acc, keep_eps, keep_acc = pes_weights(diff, done)
    c = 1.0 / (2 * std**2 * K * num_total)
    grad = jax.tree_util.tree_map(
        lambda e, a: jnp.tensordot(w_eps * c, e, axes=1) + jnp.tensordot(w_acc * c, a, axes=1), eps, acc)
    bshape = lambda w, x: jnp.reshape(w, w.shape + (1,) * (x.ndim - 1))
    new_acc = jax.tree_util.tree_map(lambda e, a: bshape(keep_eps, e) * e + bshape(keep_acc, a) * a, eps, acc)
    stats = jnp.stack([jnp.sum(jnp.where(out.mask, out.loss, 0.0)), jnp.sum(out.mask).astype(jnp.float32),
                       jnp.sum(jnp.asarray(out.metrics.get("nonfinite", 0))).astype(jnp.float32),
                       jnp.sum(done).astype(jnp.float32)])
    return grad, new_acc, stats


def stats_to_estimate(grad, stats) -> Estimate:
    metrics = {"nonfinite": stats[2].astype(jnp.int32), "resets": stats[3].astype(jnp.int32)}
    return Estimate(grad, stats[0] / jnp.maximum(stats[1], 1.0), metrics)


class TruncatedPES(TruncatedEstimator):
    def _init_state(self, theta, key, outer_state, data):
        particles = self._init_particles(theta, key, outer_state, data)
        acc = jax.tree_util.tree_map(lambda t: jnp.zeros((self.num_tasks,) + jnp.shape(t), jnp.result_type(t)), theta)
        return PESState(U.tile(particles, 2), acc)

    def _estimate(self, theta, state, key, outer_state, data):
        k_eps, k_unroll = jax.random.split(key)
        eps = U.sample_perturbations(theta, k_eps, self.num_tasks, self.std)
        states, out = U.unroll(self.truncated_step, U.tree_stack_pm(theta, eps), state.inner_state, k_unroll,
                               self.trunc_length, key_groups=2, outer_state=outer_state, data=data)
        grad, acc, stats = pes_update(out, eps, state.accumulator, self.std, self.num_tasks)
        return PESState(states, acc), stats_to_estimate(grad, stats)

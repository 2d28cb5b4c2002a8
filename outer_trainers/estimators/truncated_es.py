"""TruncatedES: antithetic ES over one truncation, carrying the + particle's state onward.

Per particle i with ε_i ~ N(0, σ²I), over the K steps of a truncation with meta-losses ℓ±_t:

    ĝ = mean_i Σ_t (ℓ⁺_it − ℓ⁻_it) ε_i / (2σ² K)

It estimates the gradient of the truncation's loss with the state at its start held fixed,
so it is biased toward short horizons — by design; TruncatedPES removes that bias.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from outer_trainers import unroll as U
from outer_trainers.tree_utils import masked_mean
from outer_trainers.estimators.gradient_estimator import Estimate, TruncatedEstimator


@struct.dataclass
class TruncatedESState:
    inner_state: object  # [N] particles


class TruncatedES(TruncatedEstimator):
    def _init_state(self, theta, key, outer_state, data):
        return TruncatedESState(self._init_particles(theta, key, outer_state, data))

    def _estimate(self, theta, state, key, outer_state, data):
        k_eps, k_unroll = jax.random.split(key)
        n, K = self.num_tasks, self.trunc_length
        eps = U.sample_perturbations(theta, k_eps, n, self.std)
        states, out = U.unroll(self.truncated_step, U.tree_stack_pm(theta, eps), U.tile(state.inner_state, 2),
                               k_unroll, K, key_groups=2, outer_state=outer_state, data=data)
        valid = out.mask[:, :n] & out.mask[:, n:]
        diff = jnp.where(valid, out.loss[:, :n] - out.loss[:, n:], 0.0).sum(0)  # [N]
        scale = diff / (2 * self.std**2 * K * n)
        grad = jax.tree_util.tree_map(lambda e: jnp.tensordot(scale, e, axes=1), eps)
        pos_state = jax.tree_util.tree_map(lambda x: x[:n], states)
        metrics = {"nonfinite": jnp.sum(out.metrics.get("nonfinite", 0)), "resets": jnp.sum(out.is_done)}
        return TruncatedESState(pos_state), Estimate(grad, masked_mean(out.loss, out.mask), metrics)

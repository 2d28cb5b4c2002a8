"""TruncatedES: antithetic ES over one truncation, carrying the + particle's state onward.

Per pair i with ε_i ~ N(0, σ²I), over the K steps of a truncation with meta-losses ℓ±_it:

    ĝ = mean_i Σ_t (ℓ⁺_it − ℓ⁻_it) ε_i / (2σ² K)

It estimates the gradient of the truncation's loss with the state at its start held fixed,
so it is biased toward short horizons — by design; TruncatedPES removes that bias.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from outer_trainers.steps import unroll as U
from outer_trainers.estimators import antithetic as A
from outer_trainers.estimators.gradient_estimator import AntitheticTruncatedEstimator, counted_estimate
from outer_trainers.tree_utils import masked_mean, tree_weighted_sum


@struct.dataclass
class TruncatedESState:
    """TruncatedES's state between truncations.

    Attributes:
        inner_state: the N particles' states (those of the + halves), leaves [N, ...].
    """

    inner_state: object


class TruncatedES(AntitheticTruncatedEstimator):
    """Truncated antithetic ES (biased toward short horizons; see the module docstring).

    Each estimate starts both halves of pair i from particle i's carried state, unrolls them K
    steps with θ ± ε_i and carries the + half's state on.

    Args:
        truncated_step: the unrolled system; a particle is one of its states.
        num_tasks: N, the number of ± pairs the estimate averages over.
        trunc_length: K, the steps of one truncation (one `estimate`).
        std: σ of the perturbations ε_i, drawn afresh for every truncation.
        random_initial_iteration_offset: staggers the particles' first episodes (see `TruncatedEstimator`).
        compiler_options: XLA compile options (see `GradientEstimator`).
    """

    def _init_state(self, theta, key, outer_state, data):
        return TruncatedESState(self._init_particles(theta, key, outer_state, data))

    def _estimate(self, theta, state, key, outer_state, data):
        k_eps, k_unroll = jax.random.split(key)
        n, K = self.num_tasks, self.trunc_length
        eps = A.sample_perturbations(theta, k_eps, n, self.std)
        states, out = U.unroll(self.truncated_step, A.tree_stack_pm(theta, eps), U.tile(state.inner_state, 2),
                               k_unroll, K, reset_groups=2, outer_state=outer_state, data=data)
        diff = A.pair_loss_diff(out.loss, out.mask).sum(0)  # [N]
        grad = tree_weighted_sum(diff / (2 * self.std**2 * K * n), eps)
        pos_state = jax.tree_util.tree_map(lambda x: x[:n], states)
        metrics = {"nonfinite": jnp.sum(out.metrics.get("nonfinite", 0)), "resets": jnp.sum(out.is_done)}
        estimate = counted_estimate(grad, masked_mean(out.loss, out.mask), A.counted_steps(out.mask), out.mask.size,
                                    metrics)
        return TruncatedESState(pos_state), estimate

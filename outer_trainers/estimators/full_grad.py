"""FullGrad: backprop through whole episodes, rematerialised.

Each estimate starts N fresh particles with θ and runs them `unroll_length` steps (default: the
truncated step's `max_episode_length`); particle i's meta-loss L_i is the mean (`avg`) or last
(`last`) counted step loss of its first episode (steps after its first `is_done` are ignored;
see `full_episode`). Then

    ĝ = mean_{i finite} ∇θ L_i(θ)

exactly, through the init and every step. Memory: steps are grouped in chunks of
`chunk_length` (default ⌈√T⌉); only chunk-boundary states are stored and each chunk is
recomputed, with each step checkpointed, on the backward pass — O((T/c + c) · state).

Particle i's init key is split(split(k_init)[0], N)[i] (as `init_particles`) and its step-t
key fold_in(split(k_unroll, N)[i], t) with (k_init, k_unroll) = split(key), so `TruncatedGrad`
with K = T started from `init_state(θ, k_init)` and estimated with `k_unroll` returns the same
gradient.
"""
from __future__ import annotations

import math
from typing import Optional

import jax
import jax.numpy as jnp
from flax import struct

from outer_trainers.estimators.full_episode import LOSS_TYPES, EpisodeLoss, episode_unroll_length
from outer_trainers.estimators.gradient_estimator import GradientEstimator, counted_estimate
from outer_trainers.estimators.truncated_grad import mean_finite_grads, particle_step_fn
from outer_trainers.validation import check_int, check_optional_int
from outer_trainers.tree_utils import masked_mean
from outer_trainers.steps.truncated_step import TruncatedStep


@struct.dataclass
class FullGradState:
    """FullGrad keeps nothing between estimates."""


class FullGrad(GradientEstimator):
    """Exact gradient of whole episodes' meta-loss by rematerialised backprop (see the module docstring).

    Args:
        truncated_step: the unrolled system; every estimate starts fresh episodes of it.
        num_tasks: N, the number of particles, >= 1.
        unroll_length: T, the most steps an episode runs; None for the step's `max_episode_length`.
        loss_type: the episode meta-loss L, "avg" (mean counted step loss) or "last" (the last one).
        chunk_length: c, steps per rematerialised chunk; None for ⌈√T⌉.
        compiler_options: XLA compile options (see `GradientEstimator`).
    """

    def __init__(self, truncated_step: TruncatedStep, num_tasks: int, unroll_length: Optional[int] = None, *,
                 loss_type: str = "avg", chunk_length: Optional[int] = None, compiler_options: Optional[dict] = None):
        self.num_tasks = check_int("num_tasks", num_tasks, minimum=1)
        if loss_type not in LOSS_TYPES:
            raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")
        self.loss_type = loss_type
        self.unroll_length = episode_unroll_length(truncated_step, unroll_length)
        c = check_optional_int("chunk_length", chunk_length, minimum=1)
        self.chunk_length = min(math.isqrt(self.unroll_length - 1) + 1 if c is None else c, self.unroll_length)
        self.name = f"FullGrad(n={self.num_tasks},T={self.unroll_length},{loss_type})"
        super().__init__(truncated_step, compiler_options)

    @property
    def inner_steps_per_estimate(self) -> int:
        return self.num_tasks * self.unroll_length

    def _init_state(self, theta, key, outer_state, data):
        del theta, key, outer_state, data
        return FullGradState()

    def _estimate(self, theta, state, key, outer_state, data):
        n, T, c = self.num_tasks, self.unroll_length, self.chunk_length
        ts = self.truncated_step
        k_init, k_unroll = jax.random.split(key)
        init_keys = jax.random.split(jax.random.split(k_init)[0], n)
        step = particle_step_fn(ts, outer_state, data, remat=True)

        def particle_loss(th, ikey, pkey):
            def one(carry, t):
                s, episode = carry
                s, out = step(th, s, jax.random.fold_in(pkey, t))
                return (s, episode.add(t, T, out, out.mask)), None

            @jax.checkpoint
            def chunk(carry, i):
                return jax.lax.scan(one, carry, i * c + jnp.arange(c))[0], None

            carry = (ts.init(th, ikey, outer_state=outer_state, data=data), EpisodeLoss.zeros(()))
            (_, episode), _ = jax.lax.scan(chunk, carry, jnp.arange(-(-T // c)))
            L = episode.meta_loss(self.loss_type)
            return L, (jax.lax.stop_gradient(L), episode)

        grads, (losses, episodes) = jax.vmap(jax.grad(particle_loss, has_aux=True), in_axes=(None, 0, 0))(
            theta, init_keys, jax.random.split(k_unroll, n))
        counted = episodes.count > 0  # a particle without a counted step has no meta-loss: it adds nothing
        grad, dropped, kept = mean_finite_grads(grads, losses, counted)
        metrics = {"nonfinite": jnp.sum(episodes.nonfinite), "resets": jnp.sum(~episodes.active),
                   "nonfinite_grads": dropped}
        num_valid = jnp.sum(jnp.where(kept, episodes.count, 0))  # the steps behind the kept gradients
        return state, counted_estimate(grad, masked_mean(losses, counted), num_valid, jnp.sum(episodes.steps), metrics)

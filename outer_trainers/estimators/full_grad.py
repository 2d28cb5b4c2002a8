"""FullGrad: backprop through whole episodes, rematerialised.

Each estimate starts N fresh particles with θ and runs them `unroll_length` steps; particle i's
meta-loss is the mean (`avg`) or final (`last`) unmasked step loss of its first episode (steps
after its first `is_done` are ignored). Then

    ĝ = mean_{i finite} ∇θ L_i(θ)

exactly, through the init and every step. Memory: steps are grouped in chunks of
`chunk_length` (default ⌈√T⌉); only chunk-boundary states are stored and each chunk is
recomputed, with each step checkpointed, on the backward pass — O((T/c + c) · state).

Constructor: `FullGrad(truncated_step, num_tasks, unroll_length=None, std=0.0, *, loss_type="avg",
chunk_length=None)`; `unroll_length` defaults to the truncation schedule's longest episode and
`std` is unused. Particle i's init key is split(split(k_init)[0], N)[i] (as `init_particles`)
and its step-t key fold_in(split(k_unroll, N)[i], t) with (k_init, k_unroll) = split(key), so
`TruncatedGrad` with K = T started from `init_state(θ, k_init)` and estimated with `k_unroll`
returns the same gradient.
"""
from __future__ import annotations

import math
from typing import Optional

import jax
import jax.numpy as jnp
from flax import struct

from outer_trainers import unroll as U
from outer_trainers.tree_utils import masked_mean
from outer_trainers.estimators.full_es import LOSS_TYPES, episode_meta_loss, max_episode_length
from outer_trainers.estimators.gradient_estimator import Estimate, GradientEstimator
from outer_trainers.estimators.truncated_grad import mean_finite_grads, particle_step_fn
from outer_trainers.truncated_step import TruncatedStep


@struct.dataclass
class FullGradState:
    """FullGrad keeps nothing between estimates."""


class FullGrad(GradientEstimator):
    def __init__(self, truncated_step: TruncatedStep, num_tasks: int, unroll_length: Optional[int] = None,
                 std: float = 0.0, *, loss_type: str = "avg", chunk_length: Optional[int] = None,
                 compiler_options: Optional[dict] = None):
        if num_tasks < 1:
            raise ValueError(f"num_tasks must be >= 1, got {num_tasks}")
        if loss_type not in LOSS_TYPES:
            raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")
        self.num_tasks, self.std, self.loss_type = int(num_tasks), float(std), loss_type
        self.unroll_length = max_episode_length(truncated_step, unroll_length)
        c = math.isqrt(self.unroll_length - 1) + 1 if chunk_length is None else int(chunk_length)
        self.chunk_length = max(1, min(c, self.unroll_length))
        self.name = f"FullGrad(n={num_tasks},T={self.unroll_length},{loss_type})"
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
                s, active, loss_sum, count, last, nonfinite = carry
                s, out = step(th, s, jax.random.fold_in(pkey, t))
                act = active & (t < T)
                use = act & out.mask
                loss = jnp.where(use, out.loss, 0.0)
                return (s, act & ~out.is_done, loss_sum + loss, count + use, jnp.where(use, out.loss, last),
                        nonfinite + (act & ~out.mask)), None

            @jax.checkpoint
            def chunk(carry, i):
                return jax.lax.scan(one, carry, i * c + jnp.arange(c))[0], None

            s0 = ts.init(th, ikey, outer_state=outer_state, data=data)
            zero = jnp.zeros((), jnp.float32)
            carry = (s0, jnp.asarray(True), zero, zero, zero, jnp.zeros((), jnp.int32))
            carry, _ = jax.lax.scan(chunk, carry, jnp.arange(-(-T // c)))
            _, active, loss_sum, count, last, nonfinite = carry
            L = episode_meta_loss(self.loss_type, loss_sum, count, last)
            return L, (jax.lax.stop_gradient(L), count, ~active, nonfinite)

        grads, (losses, count, ended, nonfinite) = jax.vmap(jax.grad(particle_loss, has_aux=True),
                                                            in_axes=(None, 0, 0))(
            theta, init_keys, jax.random.split(k_unroll, n))
        grad, dropped = mean_finite_grads(grads, losses)
        metrics = {"nonfinite": jnp.sum(nonfinite), "resets": jnp.sum(ended), "nonfinite_grads": dropped}
        return state, Estimate(grad, masked_mean(losses, count > 0), metrics)

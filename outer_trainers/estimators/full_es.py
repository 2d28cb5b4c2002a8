"""FullES: antithetic ES over whole episodes, each estimate from fresh particles.

Particle pair i starts a fresh episode with θ ± ε_i, ε_i ~ N(0, σ²I), and runs until its episode
ends (the first `is_done`) or `unroll_length` steps have passed. Its meta-loss L±_i is

    avg:  the mean of the episode's (unmasked) step losses;   last: the final step's loss.

    Δ_i = L⁺_i − L⁻_i,  optionally  Δ_i ← clip(Δ_i, −c, c)  and/or  Δ_i ← s · sign(Δ_i)
    ĝ = mean_i Δ_i ε_i / (2σ²)

Without clipping/sign this is unbiased for ∇θ of the Gaussian-smoothed episode meta-loss; the
sign variant (VeLO's recipe) trades that for robustness to heavy-tailed loss differences.

The unroll runs in one jit: a `lax.while_loop` over chunks of `chunk_length` steps (a `lax.scan`
each) that stops as soon as every particle's episode has ended, so short episodes drawn from a
random-length schedule cost only their length. Losses are accumulated on the fly, so memory
does not grow with the episode length.

Constructor: `FullES(truncated_step, num_tasks, unroll_length=None, std=0.01, *, loss_type="avg",
clip_loss_diff=None, sign_delta_loss_scalar=None, chunk_length=32)`; `unroll_length` defaults to
the longest episode of the step's truncation schedule (`trunc_sched.length` / `.max_length`).
"""
from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
from flax import struct

from outer_trainers import unroll as U
from outer_trainers.tree_utils import masked_mean
from outer_trainers.estimators.gradient_estimator import Estimate, GradientEstimator
from outer_trainers.truncated_step import TruncatedStep

LOSS_TYPES = ("avg", "last")


@struct.dataclass
class FullESState:
    """FullES keeps nothing between estimates: every estimate starts fresh episodes."""


def max_episode_length(truncated_step: TruncatedStep, unroll_length: Optional[int]) -> int:
    """`unroll_length`, or the longest episode the step's `trunc_sched` can produce."""
    if unroll_length is not None:
        if int(unroll_length) < 1:
            raise ValueError(f"unroll_length must be >= 1, got {unroll_length}")
        return int(unroll_length)
    sched = getattr(truncated_step, "trunc_sched", None)
    for attr in ("length", "max_length"):
        if isinstance(getattr(sched, attr, None), int):
            return int(getattr(sched, attr))
    raise ValueError(f"cannot infer the episode length of {type(truncated_step).__name__} "
                     f"(truncation schedule {sched!r}); pass unroll_length=")


def init_pm_particles(ts: TruncatedStep, thetas, key, num: int, outer_state, data):
    """Fresh ± particles [2N] for thetas [2N] = [θ+ε; θ−ε]; pair i and i+N share the init key."""
    keys = jax.random.split(key, num)
    keys = jnp.concatenate([keys, keys], axis=0)
    return jax.vmap(lambda th, k: ts.init(th, k, outer_state=outer_state, data=data))(thetas, keys)


def episode_meta_loss(loss_type: str, loss_sum, count, last):
    return loss_sum / jnp.maximum(count, 1.0) if loss_type == "avg" else last


class FullES(GradientEstimator):
    def __init__(self, truncated_step: TruncatedStep, num_tasks: int, unroll_length: Optional[int] = None,
                 std: float = 0.01, *, loss_type: str = "avg", clip_loss_diff: Optional[float] = None,
                 sign_delta_loss_scalar: Optional[float] = None, chunk_length: int = 32,
                 compiler_options: Optional[dict] = None):
        if num_tasks < 1:
            raise ValueError(f"num_tasks must be >= 1, got {num_tasks}")
        if not std > 0:
            raise ValueError(f"std must be > 0, got {std}")
        if loss_type not in LOSS_TYPES:
            raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")
        if clip_loss_diff is not None and not clip_loss_diff > 0:
            raise ValueError(f"clip_loss_diff must be > 0 or None, got {clip_loss_diff}")
        self.num_tasks, self.std, self.loss_type = int(num_tasks), float(std), loss_type
        self.unroll_length = max_episode_length(truncated_step, unroll_length)
        self.chunk_length = max(1, min(int(chunk_length), self.unroll_length))
        self.clip_loss_diff = clip_loss_diff
        self.sign_delta_loss_scalar = sign_delta_loss_scalar
        self.name = f"FullES(n={num_tasks},T={self.unroll_length},{loss_type})"
        super().__init__(truncated_step, compiler_options)

    @property
    def inner_steps_per_estimate(self) -> int:
        """Upper bound: episodes that end early stop the unroll sooner."""
        return 2 * self.num_tasks * self.unroll_length

    def _init_state(self, theta, key, outer_state, data):
        del theta, key, outer_state, data
        return FullESState()

    def _estimate(self, theta, state, key, outer_state, data):
        n, T, c = self.num_tasks, self.unroll_length, self.chunk_length
        k_eps, k_init, k_unroll = jax.random.split(key, 3)
        eps = U.sample_perturbations(theta, k_eps, n, self.std)
        thetas = U.tree_stack_pm(theta, eps)
        states = init_pm_particles(self.truncated_step, thetas, k_init, n, outer_state, data)
        ts = self.truncated_step

        def step(carry, t):
            states, active, loss_sum, count, last, nonfinite = carry
            keys = jax.random.split(jax.random.fold_in(k_unroll, t), n)
            states, out = ts.batched_step(thetas, states, jnp.concatenate([keys, keys], axis=0),
                                          outer_state=outer_state, data=data, reset_groups=2)
            act = active & (t < T)
            use = act & jnp.tile(out.mask[:n] & out.mask[n:], 2)  # both halves count the same steps
            loss = jnp.where(use, out.loss, 0.0)
            carry = (states, act & ~out.is_done, loss_sum + loss, count + use, jnp.where(use, out.loss, last),
                     nonfinite + (act & ~out.mask))
            return carry, None

        def chunk(args):
            i, carry = args
            carry, _ = jax.lax.scan(step, carry, i * c + jnp.arange(c))
            return i + 1, carry

        num_chunks = -(-T // c)
        zeros = jnp.zeros((2 * n,), jnp.float32)
        carry = (states, jnp.ones((2 * n,), bool), zeros, zeros, zeros, jnp.zeros((2 * n,), jnp.int32))
        _, (_, active, loss_sum, count, last, nonfinite) = jax.lax.while_loop(
            lambda a: (a[0] < num_chunks) & jnp.any(a[1][1]), chunk, (jnp.asarray(0), carry))

        L = episode_meta_loss(self.loss_type, loss_sum, count, last)
        valid = (count[:n] > 0) & (count[n:] > 0)
        diff = jnp.where(valid, L[:n] - L[n:], 0.0)
        if self.clip_loss_diff is not None:
            diff = jnp.clip(diff, -self.clip_loss_diff, self.clip_loss_diff)
        if self.sign_delta_loss_scalar is not None:
            diff = jnp.sign(diff) * self.sign_delta_loss_scalar
        scale = diff / (2 * self.std**2 * n)
        grad = jax.tree_util.tree_map(lambda e: jnp.tensordot(scale, e, axes=1), eps)
        loss = masked_mean(L, count > 0)
        metrics = {"nonfinite": jnp.sum(nonfinite), "resets": jnp.sum(~active),
                   "episode_steps": jnp.max(count)}
        return state, Estimate(grad, loss, metrics)

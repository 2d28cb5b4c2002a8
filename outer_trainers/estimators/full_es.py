"""FullES: antithetic ES over whole episodes, each estimate from fresh particles.

Particle pair i starts a fresh episode with θ ± ε_i, ε_i ~ N(0, σ²I), and runs until its episode
ends (the first `is_done`) or `unroll_length` steps have passed (default: the truncated step's
`max_episode_length`). Its meta-loss L±_i (see `full_episode`) is

    avg:  the mean of the episode's counted step losses;   last: the last counted step's loss,

where both halves count the same steps: those on which neither half's loss is masked out.

    Δ_i = L⁺_i − L⁻_i,  optionally  Δ_i ← clip(Δ_i, −c, c)  and/or  Δ_i ← s · sign(Δ_i)
    ĝ = mean_i Δ_i ε_i / (2σ²)

Without clipping/sign this is unbiased for ∇θ of the Gaussian-smoothed episode meta-loss; the
sign variant (VeLO's recipe) trades that for robustness to heavy-tailed loss differences.

The unroll runs in one jit: a `lax.while_loop` over chunks of `chunk_length` steps (a `lax.scan`
each) that stops as soon as every particle's episode has ended, so short episodes drawn from a
random-length schedule cost only their length. Losses are accumulated on the fly, so memory
does not grow with the episode length.
"""
from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
from flax import struct

from outer_trainers.steps import unroll as U
from outer_trainers.estimators import antithetic as A
from outer_trainers.estimators.full_episode import LOSS_TYPES, EpisodeLoss, episode_unroll_length
from outer_trainers.estimators.gradient_estimator import GradientEstimator, counted_estimate
from outer_trainers.validation import check_int, check_positive_float
from outer_trainers.tree_utils import masked_mean, tree_weighted_sum
from outer_trainers.steps.truncated_step import TruncatedStep


@struct.dataclass
class FullESState:
    """FullES keeps nothing between estimates: every estimate starts fresh episodes."""


def init_pm_particles(ts: TruncatedStep, thetas, key: jax.Array, num: int, outer_state, data):
    """Fresh particles of N pairs, each initialised with its own perturbed θ.

    Args:
        ts: the TruncatedStep.
        thetas: [θ + ε ; θ − ε], leaves [2N, ...].
        key: PRNG key; pair i's halves share the init key split(key, N)[i].
        num: N.
        outer_state: the outer iteration or None.
        data: the arrays of `ts.data_args()` as passed through jit, or None.

    Returns:
        Particle states with leaves [2N, ...], + halves first.
    """
    keys = U.tile(jax.random.split(key, num), 2)
    return jax.vmap(lambda th, k: ts.init(th, k, outer_state=outer_state, data=data))(thetas, keys)


class FullES(GradientEstimator):
    """Antithetic ES over whole episodes (see the module docstring).

    Args:
        truncated_step: the unrolled system; every estimate starts fresh episodes of it.
        num_tasks: N, the number of ± pairs, >= 1.
        unroll_length: T, the most steps an episode runs; None for the step's `max_episode_length`.
        std: σ of the perturbations ε_i, > 0.
        loss_type: the episode meta-loss L, "avg" (mean counted step loss) or "last" (the last one).
        clip_loss_diff: c, clip Δ_i to [−c, c] (> 0), or None.
        sign_delta_loss_scalar: s, replace Δ_i by s · sign(Δ_i) (after clipping), or None.
        chunk_length: steps per chunk of the unroll (the early-stop test runs between chunks).
        compiler_options: XLA compile options (see `GradientEstimator`).
    """

    def __init__(self, truncated_step: TruncatedStep, num_tasks: int, unroll_length: Optional[int] = None,
                 std: float = 0.01, *, loss_type: str = "avg", clip_loss_diff: Optional[float] = None,
                 sign_delta_loss_scalar: Optional[float] = None, chunk_length: int = 32,
                 compiler_options: Optional[dict] = None):
        self.num_tasks = check_int("num_tasks", num_tasks, minimum=1)
        self.std = check_positive_float("std", std)
        if loss_type not in LOSS_TYPES:
            raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")
        if clip_loss_diff is not None and not clip_loss_diff > 0:
            raise ValueError(f"clip_loss_diff must be > 0 or None, got {clip_loss_diff}")
        self.loss_type = loss_type
        self.unroll_length = episode_unroll_length(truncated_step, unroll_length)
        self.chunk_length = min(check_int("chunk_length", chunk_length, minimum=1), self.unroll_length)
        self.clip_loss_diff = clip_loss_diff
        self.sign_delta_loss_scalar = (None if sign_delta_loss_scalar is None else
                                       check_positive_float("sign_delta_loss_scalar", sign_delta_loss_scalar))
        self.name = f"FullES(n={self.num_tasks},T={self.unroll_length},{loss_type})"
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
        eps = A.sample_perturbations(theta, k_eps, n, self.std)
        thetas = A.tree_stack_pm(theta, eps)
        states = init_pm_particles(self.truncated_step, thetas, k_init, n, outer_state, data)
        ts = self.truncated_step

        def step(carry, t):
            states, episodes = carry
            keys = jax.random.split(jax.random.fold_in(k_unroll, t), n)
            states, out = ts.batched_step(thetas, states, U.tile(keys, 2), outer_state=outer_state, data=data,
                                          reset_groups=2)
            both = jnp.tile(out.mask[:n] & out.mask[n:], 2)  # both halves count the same steps
            return (states, episodes.add(t, T, out, both)), None

        def chunk(args):
            i, carry = args
            carry, _ = jax.lax.scan(step, carry, i * c + jnp.arange(c))
            return i + 1, carry

        def running(args):  # chunks left, and some episode has not ended
            i, (_, episodes) = args
            return (i < -(-T // c)) & jnp.any(episodes.active)

        _, (_, episodes) = jax.lax.while_loop(running, chunk, (jnp.asarray(0), (states, EpisodeLoss.zeros((2 * n,)))))

        L = episodes.meta_loss(self.loss_type)
        diff = A.pair_loss_diff(L, episodes.count > 0)
        if self.clip_loss_diff is not None:
            diff = jnp.clip(diff, -self.clip_loss_diff, self.clip_loss_diff)
        if self.sign_delta_loss_scalar is not None:
            diff = jnp.sign(diff) * self.sign_delta_loss_scalar
        grad = tree_weighted_sum(diff / (2 * self.std**2 * n), eps)
        loss = masked_mean(L, episodes.count > 0)
        metrics = {"nonfinite": jnp.sum(episodes.nonfinite), "resets": jnp.sum(~episodes.active),
                   "episode_steps": jnp.max(episodes.count)}
        return state, counted_estimate(grad, loss, jnp.sum(episodes.count), jnp.sum(episodes.steps), metrics)

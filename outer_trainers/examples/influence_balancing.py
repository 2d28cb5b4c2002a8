"""Influence balancing (Tallec & Ollivier 2017; the PES paper's toy) as a TruncatedStep.

State s ∈ R^23, scalar θ, one never-ending episode:

    s ← A s + θ c,   A = ½ I + ½ (superdiagonal),   c = (+1 ×10, −1 ×13)
    step loss = ½ (s₀ − 1)²      (on the updated state)

θ's immediate effect on s₀ is +1, but through the chain s₁ → s₀, …, s₂₂ → s₂₁ its delayed
effects are negative: the steady state is s₀ = 2θ Σ c = −6θ, so the best θ is −1/6. Truncated
estimators with K = 1 (TruncatedES, TruncatedGrad) see only the +1 and push θ up, away from
−1/6; unbiased online estimators (TruncatedPES, NoiseReuseES) converge to it.

`meta_train(estimator, theta0, num_steps, learning_rate, key)` runs plain-SGD meta-training
inside one jit and returns θ after every outer step.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from outer_trainers.estimators.gradient_estimator import GradientEstimator
from outer_trainers.steps.truncated_step import StepOut, TruncatedStep

DIM = 23
THETA_STAR = -1.0 / 6.0


def influence_matrix(dim: int = DIM) -> np.ndarray:
    """A = ½ I + ½ (superdiagonal), float32 [dim, dim]: s_j ← ½ s_j + ½ s_{j+1}."""
    return 0.5 * np.eye(dim, dtype=np.float32) + 0.5 * np.eye(dim, k=1, dtype=np.float32)


def influence_vector(num_positive: int = 10, dim: int = DIM) -> np.ndarray:
    """c = (+1 × num_positive, −1 × (dim − num_positive)), float32 [dim]: θ's direct effect on s."""
    return np.concatenate([np.ones(num_positive), -np.ones(dim - num_positive)]).astype(np.float32)


@struct.dataclass
class InfluenceState:
    """The state of one influence-balancing particle.

    Attributes:
        s: float32 [dim], the system's state.
        step: int32 [], steps taken (counted from `initial_offset`; the episode never ends).
    """

    s: jax.Array
    step: jax.Array


class InfluenceBalancing(TruncatedStep):
    """The influence-balancing system (see the module docstring); θ is a float32 scalar array.

    `init` starts from s = 0; its episode never ends (`max_episode_length` is None), so
    `initial_offset` only sets the step counter.

    Args:
        dim: the dimension of s (23 in the PES paper).
        num_positive: how many leading entries of c are +1 (the rest are −1); 0 < num_positive < dim.
    """

    def __init__(self, dim: int = DIM, num_positive: int = 10):
        if not 0 < num_positive < dim:
            raise ValueError(f"need 0 < num_positive < dim, got {num_positive}, {dim}")
        self.dim, self.num_positive = int(dim), int(num_positive)

    def init(self, theta, key, *, outer_state=None, data=None, initial_offset=0):
        del theta, key, outer_state, data
        return InfluenceState(jnp.zeros((self.dim,), jnp.float32), jnp.asarray(initial_offset, jnp.int32))

    def step(self, theta, state, key, *, outer_state=None, data=None):
        del key, outer_state, data
        A = jnp.asarray(influence_matrix(self.dim))
        c = jnp.asarray(influence_vector(self.num_positive, self.dim))
        s = A @ state.s + theta * c
        loss = 0.5 * jnp.square(s[0] - 1.0)
        return InfluenceState(s, state.step + 1), StepOut(loss=loss, is_done=jnp.asarray(False),
                                                          mask=jnp.asarray(True))


def meta_train(estimator: GradientEstimator, theta0: float, num_steps: int, learning_rate: float,
               key: jax.Array) -> np.ndarray:
    """SGD on θ with `estimator`'s estimates, all `num_steps` in one jitted lax.scan.
    Returns θ after each outer step, shape [num_steps]."""
    theta = jnp.asarray(theta0, jnp.float32)
    k_init, k_train = jax.random.split(key)

    @jax.jit
    def run(theta, k_init, k_train):
        state = estimator.init_state(theta, k_init)

        def body(carry, k):
            theta, state = carry
            state, est = estimator.estimate(theta, state, k)
            theta = theta - learning_rate * est.grad
            return (theta, state), theta

        return jax.lax.scan(body, (theta, state), jax.random.split(k_train, num_steps))[1]

    return np.asarray(run(theta, k_init, k_train))

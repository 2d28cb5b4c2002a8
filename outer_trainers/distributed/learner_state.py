"""The distributed learner's state and the keys of the workers' particles.

    state = init_learner_state(learner, key)          # OuterTrainState without particles
    keys = particle_keys(seed, state, K)               # init_outer_state's keys at step 0

The learner of `ray_outer_train` holds `init_outer_state`'s state minus the estimator states (the
workers own the particles), with the same key splits, so that a synchronous run draws the same
theta, particles and estimate keys as `outer_train` with the same seed.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from outer_trainers.learner.gradient_learner import GradientLearner
from outer_trainers.learner.outer_train import OuterTrainState


def init_learner_state(learner: GradientLearner, num_estimators: int, key: jax.Array) -> OuterTrainState:
    """The learner's state of a new run: `init_outer_state`'s, without the particles (workers own them).

    Args:
        learner: the GradientLearner.
        num_estimators: K, the run's estimators (their particles are drawn by `particle_keys`).
        key: the run's PRNG key.

    Returns:
        OuterTrainState with `estimator_states=()` and iteration 0; theta and the key equal `init_outer_state`'s.
    """
    k_learner, _, key = jax.random.split(key, 3)
    return OuterTrainState(learner.init(k_learner), (), key, jnp.zeros((), jnp.int32))


def particle_keys(seed: int, state: OuterTrainState, num_estimators: int, salt: int = 0) -> list:
    """Keys of fresh particles: at step 0 (salt 0) those `init_outer_state` uses; otherwise new ones.

    Args:
        seed: the run's seed.
        state: the learner's state (its step and key).
        num_estimators: K.
        salt: distinguishes re-initialisations at the same step (e.g. after a worker restart).

    Returns:
        K typed keys.
    """
    if state.step == 0 and salt == 0:
        _, k_est, _ = jax.random.split(jax.random.key(seed), 3)
        return list(jax.random.split(k_est, num_estimators))
    base = jax.random.fold_in(jax.random.fold_in(state.key, state.step), salt)
    return list(jax.random.split(base, num_estimators))

"""Influence balancing: steady state s₀ = −6θ; PES and NRES converge to θ* = −1/6, K = 1 TES/TBPTT drift up."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import outer_trainers as ot
from outer_trainers.examples.influence_balancing import THETA_STAR, InfluenceBalancing, meta_train


def test_steady_state_is_minus_six_theta():
    ts = InfluenceBalancing()
    theta = jnp.asarray(0.3)
    s = ts.init(theta, jax.random.key(0))
    for _ in range(200):
        s, out = ts.step(theta, s, jax.random.key(0))
    np.testing.assert_allclose(float(s.s[0]), -6 * 0.3, rtol=1e-5)
    np.testing.assert_allclose(float(out.loss), 0.5 * (1 + 1.8) ** 2, rtol=1e-5)
    assert not bool(out.is_done)


def test_one_never_ending_episode():
    ts = InfluenceBalancing()
    state = ts.init(jnp.asarray(0.3), jax.random.key(0), initial_offset=3)  # offsets only move the counter
    assert int(state.step) == 3 and not np.any(np.asarray(state.s))
    assert ts.max_episode_length is None


@pytest.mark.parametrize("cls", [ot.TruncatedPES, ot.NoiseReuseES])
def test_unbiased_online_estimators_converge_to_minus_one_sixth(cls):
    thetas = meta_train(cls(InfluenceBalancing(), 100, 1, std=0.1), 0.5, 3000, 1e-4, jax.random.key(0))
    assert abs(thetas[-1] - THETA_STAR) < 0.01, thetas[::250]


@pytest.mark.parametrize("make", [lambda ts: ot.TruncatedES(ts, 16, 1, std=0.1), lambda ts: ot.TruncatedGrad(ts, 1, 1)],
                         ids=["TruncatedES", "TruncatedGrad"])
def test_k1_truncated_estimators_drift_to_positive_theta(make):
    thetas = meta_train(make(InfluenceBalancing()), 0.5, 2500, 1e-4, jax.random.key(0))
    assert thetas[-1] > 1.0, thetas[::250]

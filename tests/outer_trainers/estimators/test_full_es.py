"""FullES: clipping/sign, early stop, the default unroll length, one-sided NaN pairs (the rest:
test_estimator_contract)."""
import jax
import numpy as np
import pytest

import outer_trainers as ot
from outer_trainers.examples.influence_balancing import InfluenceBalancing
from tests.outer_trainers.estimators import estimator_checks as C


@pytest.fixture(scope="module")
def problem():
    return C.quadratic_step(), C.theta0()


def test_clip_and_sign_bound_the_estimate(problem):
    ts, theta = problem
    n, std, s = 1, 0.01, 1e-4
    key = jax.random.key(3)
    raw = ot.FullES(ts, n, std=std).estimate(theta, None, key)[1].grad
    sign = ot.FullES(ts, n, std=std, sign_delta_loss_scalar=s).estimate(theta, None, key)[1].grad
    clip = ot.FullES(ts, n, std=std, clip_loss_diff=1e-12).estimate(theta, None, key)[1].grad
    # the same ε: sign-scaled estimate = sign(Δ) s ε / (2σ²) = raw · s / |Δ|; clipping to ~0 gives ~0
    assert np.all(np.abs(C.flat(clip)) < 1e-6)
    eps_bound = s * 4 * std / (2 * std**2)  # |ε| < 4σ for every coordinate here
    assert np.all(np.abs(C.flat(sign)) < eps_bound) and np.any(C.flat(sign) != 0)
    ratio = C.flat(sign) / C.flat(raw)
    np.testing.assert_allclose(ratio, ratio[0], rtol=1e-4)
    assert ratio[0] > 0


def test_stops_when_every_episode_has_ended(problem):
    ts, theta = problem
    est = ot.FullES(ts, 4, 1000, chunk_length=4)
    _, e = est.estimate(theta, est.init_state(theta, jax.random.key(0)), jax.random.key(1))
    assert int(e.metrics["episode_steps"]) == C.EPISODE and int(e.metrics["resets"]) == 8


def test_unroll_length_defaults_to_the_longest_episode():
    sched = ot.LogUniformTruncationSchedule(3, 11)
    ts = C.quadratic_step(sched)
    assert ot.FullES(ts, 2).unroll_length == ts.max_episode_length == 11
    never = InfluenceBalancing()  # one episode that never ends: max_episode_length is None
    with pytest.raises(ValueError, match="max_episode_length is None.*pass unroll_length="):
        ot.FullES(never, 2)
    assert ot.FullES(never, 2, 10).unroll_length == 10


class _OneSidedNaN(ot.TruncatedStep):
    """loss_t = x·(t+1) on steps t = 0, 1, ...; NaN from t = 2 on when x > 0.5. At x = 0.5 exactly
    one half of every ± pair goes non-finite at t = 2 while the other stays finite."""

    def init(self, theta, key, *, outer_state=None, data=None, initial_offset=0):
        return jax.numpy.asarray(initial_offset, jax.numpy.int32)

    def step(self, theta, t, key, *, outer_state=None, data=None):
        x = theta["x"]
        loss = jax.numpy.where((x > 0.5) & (t >= 2), jax.numpy.nan, x * (t + 1))
        finite = jax.numpy.isfinite(loss)
        done = (t + 1 >= 6) | ~finite
        return jax.numpy.where(done, 0, t + 1), ot.StepOut(jax.numpy.where(finite, loss, 0.0), done, finite)


def test_one_sided_nonfinite_pair_compares_the_same_steps():
    """Both halves stop together and average the same steps (t = 0, 1): diff_i = 1.5·2ε_i, so
    the estimate is 1.5·mean(ε²)/σ² ≈ 1.5. Averaging the finite half over one more step than the
    other would give ≈ −0.25·E|ε|/(2σ²) + 1.75 ≈ −8 instead."""
    n, std = 512, 0.01
    est = ot.FullES(_OneSidedNaN(), n, 6, std=std)
    _, e = est.estimate({"x": jax.numpy.float32(0.5)}, None, jax.random.key(0))
    assert int(e.metrics["nonfinite"]) == n  # one half of every pair
    np.testing.assert_allclose(float(e.grad["x"]), 1.5, atol=4 * 1.5 * np.sqrt(2 / n))

"""FullES: unbiased for the whole-episode meta-loss (avg and last), clipping/sign, early stop, NaNs."""
import jax
import numpy as np
import pytest

import outer_trainers as ot
from tests.outer_trainers.estimators import estimator_checks as C


@pytest.fixture(scope="module")
def problem():
    ts = C.quadratic_step()
    theta = C.theta0()
    return ts, theta, C.episode_jacobian(ts, theta)


@pytest.mark.parametrize("loss_type", ["avg", "last"])
def test_mean_matches_exact_episode_gradient(problem, loss_type):
    ts, theta, jac = problem
    ref = jac.mean(0) if loss_type == "avg" else jac[-1]
    est = ot.FullES(ts, 256, std=0.01, loss_type=loss_type, chunk_length=3)  # 7 steps: chunks 3+3+1
    C.assert_unbiased(C.collect(est, theta, 1, replicates=30), ref[None])


def test_clip_and_sign_bound_the_estimate(problem):
    ts, theta, _ = problem
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
    ts, theta, _ = problem
    est = ot.FullES(ts, 4, unroll_length=1000, chunk_length=4)
    _, e = est.estimate(theta, est.init_state(theta, jax.random.key(0)), jax.random.key(1))
    assert int(e.metrics["episode_steps"]) == C.EPISODE and int(e.metrics["resets"]) == 8
    with pytest.raises(ValueError, match="unroll_length"):
        ot.FullES(C.nan_step().__class__.__new__(C.nan_step().__class__), 4)


def test_no_recompile(problem, compile_counter):
    C.assert_no_recompile(ot.FullES(problem[0], 4), problem[1], compile_counter)


def test_nonfinite_particles_end_their_episode_and_are_counted():
    C.assert_nonfinite_handled(ot.FullES(C.nan_step(), 8), C.theta0())


class _OneSidedNaN(ot.TruncatedStep):
    """loss_t = x·(t+1) on steps t = 0, 1, ...; NaN from t = 2 on when x > 0.5. At x = 0.5 exactly
    one half of every ± pair goes non-finite at t = 2 while the other stays finite."""

    def init(self, theta, key, *, outer_state=None, data=None):
        return jax.numpy.zeros((), jax.numpy.int32)

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
    est = ot.FullES(_OneSidedNaN(), n, unroll_length=6, std=std)
    _, e = est.estimate({"x": jax.numpy.float32(0.5)}, None, jax.random.key(0))
    assert int(e.metrics["nonfinite"]) == n  # one half of every pair
    np.testing.assert_allclose(float(e.grad["x"]), 1.5, atol=4 * 1.5 * np.sqrt(2 / n))

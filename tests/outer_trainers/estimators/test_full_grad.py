"""FullGrad: equals the exact episode gradient (avg and last), remat chunking invariance, NaNs."""
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


@pytest.mark.parametrize("loss_type,chunk", [("avg", None), ("last", 2)])
def test_equals_exact_episode_gradient(problem, loss_type, chunk):
    ts, theta, jac = problem
    ref = jac.mean(0) if loss_type == "avg" else jac[-1]
    est = ot.FullGrad(ts, 2, unroll_length=9, loss_type=loss_type, chunk_length=chunk)  # runs past the episode
    _, e = est.estimate(theta, est.init_state(theta, jax.random.key(0)), jax.random.key(1))
    np.testing.assert_allclose(C.flat(e.grad), ref, rtol=1e-4, atol=1e-7)
    assert int(e.metrics["resets"]) == 2


def test_no_recompile(problem, compile_counter):
    C.assert_no_recompile(ot.FullGrad(problem[0], 2), problem[1], compile_counter)


def test_nonfinite_particles_are_dropped_and_counted():
    est = ot.FullGrad(C.nan_step(), 8)
    C.assert_nonfinite_handled(est, C.theta0())

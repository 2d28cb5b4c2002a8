"""TruncatedPES: unbiased across truncations with resets (statistical), staggering, no recompiles, NaNs."""
import jax
import numpy as np
import pytest

import outer_trainers as ot
from tests.outer_trainers.estimators import estimator_checks as C


@pytest.fixture(scope="module")
def problem():
    return C.truncated_problem()


def test_pes_mean_matches_exact_gradient_across_resets(problem):
    ts, theta, ref = problem
    samples = C.collect(ot.TruncatedPES(ts, 64, C.TRUNC, std=0.01), theta, C.NUM_TRUNCS, replicates=40)
    C.assert_unbiased(samples, ref)


def test_statistical_check_rejects_truncated_es(problem):
    """The same check must fail for TruncatedES (short-horizon bias) — it has power."""
    ts, theta, ref = problem
    samples = C.collect(ot.TruncatedES(ts, 64, C.TRUNC, std=0.01), theta, C.NUM_TRUNCS, replicates=20)
    z = C.z_scores(samples, ref)
    assert np.abs(z[1:]).max() > 10


def test_random_offset_staggers_resets():
    ts = C.quadratic_step(episode=12)
    theta = C.theta0()
    est = ot.TruncatedPES(ts, 32, 2, std=0.01, random_initial_iteration_offset=11)
    state = est.init_state(theta, jax.random.key(0))
    steps = np.asarray(state.inner_state.inner_step[:32])
    assert len(set(steps.tolist())) > 5 and steps.max() <= 11
    np.testing.assert_array_equal(steps, np.asarray(state.inner_state.inner_step[32:]))
    resets = []
    for i in range(6):
        state, e = est.estimate(theta, state, jax.random.key(i))
        resets.append(int(e.metrics["resets"]))
    # 32 particles reset once per 12 steps: spread over the six truncations, not all in one
    assert sum(resets) >= 32 and max(resets) < 32


def test_no_recompile(compile_counter):
    C.assert_no_recompile(ot.TruncatedPES(C.quadratic_step(), 4, C.TRUNC), C.theta0(), compile_counter)


def test_nonfinite_particles_reset_and_are_counted():
    C.assert_nonfinite_handled(ot.TruncatedPES(C.nan_step(), 8, 3), C.theta0())

"""TruncatedGrad: full-length truncation equals FullGrad; carries state; remat is exact; non-finite
gradients are dropped (the rest: test_estimator_contract)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lopt
import outer_trainers as ot
from outer_trainers.estimators.truncated_grad import mean_finite_grads
from tasks.quadratics import QuadraticFamily
from tests.fixtures import lopt_step
from tests.outer_trainers.estimators import estimator_checks as C


@pytest.fixture(scope="module")
def random_family_step():
    return lopt_step(QuadraticFamily(3, noise_std=0.5), lopt.LearnableSGDM(0.1, 0.5), 9)


@pytest.mark.slow
def test_full_length_truncation_equals_full_grad(random_family_step):
    """Random tasks, random init, noisy gradients: the same keys give the same gradient."""
    ts, theta = random_family_step, C.theta0()
    key = jax.random.key(5)
    k_init, k_unroll = jax.random.split(key)
    _, full = ot.FullGrad(ts, 4, chunk_length=4).estimate(theta, None, key)
    tg = ot.TruncatedGrad(ts, 4, 9, remat=True)
    _, trunc = tg.estimate(theta, tg.init_state(theta, k_init), k_unroll)
    np.testing.assert_allclose(C.flat(trunc.grad), C.flat(full.grad), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(float(trunc.loss), float(full.loss), rtol=1e-6)
    assert np.all(C.flat(full.grad) != 0)


@pytest.mark.slow
def test_remat_and_carried_state(random_family_step):
    ts, theta = random_family_step, C.theta0()
    a, b = ot.TruncatedGrad(ts, 3, 4), ot.TruncatedGrad(ts, 3, 4, remat=True)
    sa = a.init_state(theta, jax.random.key(0))
    sb = b.init_state(theta, jax.random.key(0))
    for i in range(3):  # 12 steps: crosses the episode boundary at 9
        sa, ea = a.estimate(theta, sa, jax.random.key(i))
        sb, eb = b.estimate(theta, sb, jax.random.key(i))
        np.testing.assert_allclose(C.flat(ea.grad), C.flat(eb.grad), rtol=1e-5, atol=1e-8)
    np.testing.assert_array_equal(np.asarray(sa.inner_state.inner_step), [3, 3, 3])


def test_nonfinite_gradients_are_dropped_and_counted():
    est = ot.TruncatedGrad(C.nan_step(), 8, 3)
    state = est.init_state(C.theta0(), jax.random.key(0))
    dropped = 0
    for i in range(3):
        state, e = est.estimate(C.theta0(), state, jax.random.key(i))
        assert np.all(np.isfinite(C.flat(e.grad))) and np.isfinite(float(e.loss))
        dropped += int(e.metrics["nonfinite_grads"])
    assert dropped > 0


def test_mean_finite_grads_says_which_particles_it_kept():
    """The estimators count only the kept particles' steps as valid, so an estimate that kept none is dropped."""
    grads, losses = {"w": jnp.array([[1.0], [jnp.nan], [3.0]])}, jnp.array([0.5, 0.5, jnp.inf])
    g, dropped, kept = mean_finite_grads(grads, losses)
    assert float(g["w"][0]) == 1.0 and int(dropped) == 2 and kept.tolist() == [True, False, False]
    g, dropped, kept = mean_finite_grads(grads, losses, jnp.array([False, True, True]))
    assert float(g["w"][0]) == 0.0 and int(dropped) == 2 and not kept.any()

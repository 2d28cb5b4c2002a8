"""TruncatedPESPMAP: same estimate as TruncatedPES on 1, 2 and 4 devices; divisibility error (the
1-device contract: test_estimator_contract).

Multi-device tests are marked `multidevice` and run in their own invocation:
    XLA_FLAGS=--xla_force_host_platform_device_count=4 pytest -m multidevice
They fail (not skip) when fewer than 4 devices are visible.
"""
import chex
import jax
import numpy as np
import pytest

import outer_trainers as ot
from tests.fixtures import lopt_step
from tests.outer_trainers.estimators import estimator_checks as C


def _run(est, theta, num_truncs=3, seed=0):
    state = est.init_state(theta, jax.random.key(seed))
    grads, losses = [], []
    for k in range(num_truncs):
        state, e = est.estimate(theta, state, jax.random.key(seed * 100 + k + 1))
        grads.append(C.flat(e.grad))
        losses.append(float(e.loss))
    return np.stack(grads), np.asarray(losses), state


def _assert_matches_pes(ts, theta, n, num_devices, offset=0):
    g_ref, l_ref, s_ref = _run(ot.TruncatedPES(ts, n, C.TRUNC, std=0.01, random_initial_iteration_offset=offset),
                               theta)
    est = ot.TruncatedPESPMAP(ts, n, C.TRUNC, std=0.01, random_initial_iteration_offset=offset,
                              num_devices=num_devices)
    g, l, s = _run(est, theta)
    np.testing.assert_allclose(g, g_ref, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(l, l_ref, rtol=1e-5)
    steps = np.asarray(s.inner_state.inner_step).reshape(-1)
    np.testing.assert_array_equal(steps, np.asarray(s_ref.inner_state.inner_step))
    np.testing.assert_allclose(C.flat(s.accumulator), C.flat(s_ref.accumulator), rtol=1e-5, atol=1e-7)
    return est, s


@pytest.mark.slow
def test_single_device_matches_truncated_pes():
    _assert_matches_pes(C.quadratic_step(), C.theta0(), 8, num_devices=1, offset=5)


def test_num_tasks_not_divisible_by_devices_is_a_clear_error():
    one = jax.local_devices()[:1]
    with pytest.raises(ValueError, match="num_tasks=3 is not divisible by the 2 devices"):
        ot.TruncatedPESPMAP(C.quadratic_step(), 3, 2, devices=one * 2)  # checked before the mesh is built
    with pytest.raises(ValueError, match="local devices"):
        ot.TruncatedPESPMAP(C.quadratic_step(), 8, 2, num_devices=len(jax.local_devices()) + 1)


# ----------------------------------------------------------------- multi-device (4 host devices)

@pytest.fixture(scope="module")
def four_devices():
    n = jax.device_count()
    if n < 4:
        pytest.fail(f"multidevice tests need 4 devices but {n} visible: run them as "
                    f"XLA_FLAGS=--xla_force_host_platform_device_count=4 pytest -m multidevice")
    return n


@pytest.mark.multidevice
@pytest.mark.parametrize("num_devices", [pytest.param(1, marks=pytest.mark.slow), pytest.param(2, marks=pytest.mark.slow), 4])
def test_matches_truncated_pes_on_devices(four_devices, num_devices):
    est, state = _assert_matches_pes(C.quadratic_step(), C.theta0(), 8, num_devices=num_devices, offset=5)
    leaf = jax.tree_util.tree_leaves(state.inner_state)[0]
    assert len(leaf.sharding.device_set) == num_devices


@pytest.mark.multidevice
def test_divisibility_error_on_four_devices(four_devices):
    with pytest.raises(ValueError, match="num_tasks=6 is not divisible by the 4 devices"):
        ot.TruncatedPESPMAP(C.quadratic_step(), 6, 2, num_devices=4)


def _noisy_step():
    import lopt
    from tasks.quadratics import QuadraticFamily
    return lopt_step(QuadraticFamily(2, noise_std=0.5), lopt.LearnableSGDM(0.1, 0.5), 5)


@pytest.mark.slow
@pytest.mark.multidevice
def test_share_data_changes_keys_only_across_devices(four_devices):
    """share_data=True: device d's particle j reuses device 0's particle-j step keys, so on one
    device it is exactly PES and on four devices it is not (but still finite)."""
    ts, theta = _noisy_step(), C.theta0()
    g_pes, _, _ = _run(ot.TruncatedPES(ts, 8, 3), theta)
    g_one, _, _ = _run(ot.TruncatedPESPMAP(ts, 8, 3, num_devices=1, share_data=True), theta)
    g_four, _, _ = _run(ot.TruncatedPESPMAP(ts, 8, 3, num_devices=4, share_data=True), theta)
    np.testing.assert_allclose(g_one, g_pes, rtol=1e-4, atol=1e-6)
    assert np.all(np.isfinite(g_four)) and not np.allclose(g_four, g_pes, rtol=1e-3)


@pytest.mark.multidevice
@pytest.mark.parametrize("make", [ot.TruncatedPESPMAP, ot.TruncatedPES])
def test_no_recompile_on_four_devices(four_devices, compile_counter, make):
    C.assert_no_recompile(make(C.quadratic_step(), 8, C.TRUNC, num_devices=4), C.theta0(), compile_counter)


@pytest.mark.slow
@pytest.mark.multidevice
def test_unbiased_on_four_devices(four_devices):
    ts, theta = C.quadratic_step(), C.theta0()
    ref = C.truncation_references(C.episode_jacobian(ts, theta), C.TRUNC, C.NUM_TRUNCS)
    samples, max_z = C.collect_for_test(ot.TruncatedPESPMAP(ts, 64, C.TRUNC, std=0.01, num_devices=4), theta, ref)
    C.assert_unbiased(samples, ref, max_z)


@pytest.mark.slow
@pytest.mark.multidevice
def test_resume_from_checkpoint_on_four_devices(four_devices, tmp_path):
    """A checkpointed TruncatedPESPMAP run resumed in a fresh outer_train call ends with exactly
    the theta of an uninterrupted run, and its restored particle state is sharded over the 4
    devices again by the first estimate."""
    import optax
    import lopt
    lo = lopt.LearnableSGDM(0.1, 0.5)
    est = ot.TruncatedPESPMAP(C.quadratic_step(), 8, C.TRUNC, std=0.01, random_initial_iteration_offset=4,
                              num_devices=4)
    learner = ot.GradientLearner(lo, optax.adam(0.02))
    policy = ot.CheckpointPolicy(every_steps=3, every_seconds=None, keep=2)
    straight = ot.outer_train(learner, [est], 7, seed=5, reporting=ot.Reporting(progress=False))
    out = str(tmp_path / "run")
    ot.outer_train(learner, [est], 3, output_dir=out, seed=5, reporting=ot.Reporting(progress=False),
                   checkpoint_policy=policy)
    resumed = ot.outer_train(learner, [est], 7, output_dir=out, seed=5, reporting=ot.Reporting(progress=False),
                             checkpoint_policy=policy)
    assert resumed.step == 7
    chex.assert_trees_all_equal(resumed.theta, straight.theta)
    leaf = jax.tree_util.tree_leaves(resumed.estimator_states[0].inner_state)[0]
    assert len(leaf.sharding.device_set) == 4

"""Theta averaging (`GradientLearner(theta_ema=d)`, `train.theta_ema`): the moving average kept in the
learner's state, hand-computed; resumed bit for bit; the run's result (theta_final) when enabled;
nothing changed without it (with Ray workers: tests/outer_trainers/distributed/test_averaging_and_validation.py)."""
import os

import chex
import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lopt
import outer_trainers as ot
import tasks
from outer_trainers.learner import gin_run
from outer_trainers.runs.checkpoint_files import read
from outer_trainers.runs.checkpoint_manager import CheckpointManager
from tests.fixtures import lopt_step
from tests.outer_trainers.learner.test_gin_run import TINY


def _const_est(theta, value):
    return ot.Estimate(grad=jax.tree_util.tree_map(lambda t: jnp.full_like(t, value), theta),
                       loss=jnp.asarray(1.0, jnp.float32))


def test_average_is_the_hand_computed_ema_and_skips_dropped_steps():
    learner = ot.GradientLearner(lopt.LearnableSGD(1e-2), optax.sgd(1.0), theta_ema=0.5)
    state = learner.init(jax.random.key(0))
    t0 = float(state.theta["log_lr"])
    assert float(state.theta_avg["log_lr"]) == t0  # the average starts at theta_0
    for g in (1.0, 2.0, np.nan, 4.0):  # sgd(1): theta -= g; the NaN estimate is dropped
        state, _ = learner.update(state, [_const_est(state.theta, g)])
    # thetas t0-1, t0-3, (dropped), t0-7; ema with d=0.5: avg = 0.5 avg + 0.5 theta
    avg = t0
    for th in (t0 - 1, t0 - 3, t0 - 7):
        avg = 0.5 * avg + 0.5 * th
    np.testing.assert_allclose(float(state.theta["log_lr"]), t0 - 7, rtol=1e-6)
    np.testing.assert_allclose(float(state.theta_avg["log_lr"]), avg, rtol=1e-6)
    assert int(state.step) == 3


@pytest.mark.parametrize("bad", [1.0, -0.1, 1.5, True, "0.9"])
def test_bad_decays_are_refused(bad):
    with pytest.raises(ValueError, match="theta_ema"):
        ot.GradientLearner(lopt.LearnableSGD(1e-2), optax.sgd(1.0), theta_ema=bad)


def test_without_averaging_the_state_holds_no_average():
    state = ot.GradientLearner(lopt.LearnableSGD(1e-2), optax.sgd(1.0)).init(jax.random.key(0))
    assert state.theta_avg is None and len(jax.tree_util.tree_leaves(state)) == len(
        jax.tree_util.tree_leaves((state.theta, state.opt_state, state.step)))


@pytest.fixture(scope="module")
def tiny():
    lo = lopt.LearnableSGD(1e-2)
    est = ot.TruncatedPES(lopt_step(tasks.QuadraticFamily(dim=4), lo, 12), num_tasks=2, trunc_length=4, std=0.05)
    return lo, est


def _train(tiny, num_steps, output_dir=None, ema=0.8, callback=None):
    lo, est = tiny
    learner = ot.GradientLearner(lo, optax.adam(0.05), theta_ema=ema)
    policy = ot.CheckpointPolicy(every_steps=1, every_seconds=None, keep=20)
    return ot.outer_train(learner, [est], num_steps, output_dir=output_dir,
                          reporting=ot.Reporting(progress=False, tensorboard=False), seed=3,
                          checkpoint_policy=policy if output_dir else None, callback=callback)


def test_a_runs_average_is_the_ema_of_its_thetas_and_its_result(tiny, tmp_path):
    thetas = []
    state = _train(tiny, 5, str(tmp_path), callback=lambda i, s, m: thetas.append(float(s.theta["log_lr"])))
    avg = float(np.log(1e-2))
    for th in thetas:
        avg = np.float32(0.8) * np.float32(avg) + np.float32(0.2) * np.float32(th)
    assert len(thetas) == 5 and len(set(thetas)) == 5
    np.testing.assert_allclose(float(state.learner_state.theta_avg["log_lr"]), avg, rtol=1e-6)
    assert state.final_theta is state.learner_state.theta_avg
    final = lopt.load_theta(str(tmp_path / "theta_final.msgpack"), tiny[0])
    last = lopt.load_theta(str(tmp_path / "theta_last.msgpack"), tiny[0])
    np.testing.assert_array_equal(final["log_lr"], state.learner_state.theta_avg["log_lr"])
    np.testing.assert_array_equal(last["log_lr"], state.theta["log_lr"])
    assert float(final["log_lr"]) != float(last["log_lr"])
    # the checkpoint holds the average
    newest = CheckpointManager(str(tmp_path / "checkpoints")).newest_readable()
    assert any(p.startswith(".learner_state.theta_avg") for p, *_ in read(newest[0])["structure"])


def test_resume_mid_run_gives_the_identical_average(tiny, tmp_path):
    whole = _train(tiny, 6, str(tmp_path / "whole"))
    _train(tiny, 3, str(tmp_path / "cut"))
    resumed = _train(tiny, 6, str(tmp_path / "cut"))
    chex.assert_trees_all_equal(resumed.learner_state.theta_avg, whole.learner_state.theta_avg)
    chex.assert_trees_all_equal(resumed.theta, whole.theta)
    # a run without averaging may not resume a run with it (the state's structure differs): refused, named
    with pytest.raises(ValueError, match="structure"):
        _train(tiny, 7, str(tmp_path / "cut"), ema=None)


def test_without_averaging_theta_final_is_the_last_theta_and_no_theta_last(tiny, tmp_path):
    state = _train(tiny, 3, str(tmp_path), ema=None)
    assert state.final_theta is state.theta
    assert not os.path.exists(tmp_path / "theta_last.msgpack")
    newest = CheckpointManager(str(tmp_path / "checkpoints")).newest_readable()
    assert not any("theta_avg" in p for p, *_ in read(newest[0])["structure"])


def test_gin_train_uses_the_average(tmp_path):
    gin.clear_config()
    try:
        gin.parse_config(TINY + "\ntrain.num_steps = 4\ntrain.theta_ema = 0.5\nReporting.progress = False\n")
        state = gin_run.train(str(tmp_path))
    finally:
        gin.clear_config()
    assert state.learner_state.theta_avg is not None
    final = lopt.load_theta(str(tmp_path / "theta_final.msgpack"))
    np.testing.assert_array_equal(final["log_lr"], state.learner_state.theta_avg["log_lr"])

import json
import os

import jax
import numpy as np
import optax
import pytest

import lopt
import outer_trainers as ot
import tasks


@pytest.fixture(scope="module")
def quad_setup():
    family = tasks.QuadraticFamily(dim=8)
    lo = lopt.LearnableSGD(1e-3)
    step = ot.LOptTruncatedStep(family, lo, ot.ConstantTruncationSchedule(40))
    est = ot.TruncatedPES(step, num_tasks=8, trunc_length=10, std=0.05, random_initial_iteration_offset=30)
    return lo, est


def test_outer_train_lowers_meta_loss(quad_setup, tmp_path):
    lo, est = quad_setup
    learner = ot.GradientLearner(lo, optax.adam(0.1))
    first = []
    state = ot.outer_train(learner, [est], num_steps=30, output_dir=str(tmp_path), progress=False)
    lines = [json.loads(l) for l in open(tmp_path / "metrics.jsonl")]
    assert len(lines) == 30 and lines[-1]["step"] == 30
    for k in ("meta_loss", "grad_norm", "theta_norm", "inner_steps_per_s", "num_dropped"):
        assert k in lines[0]
    # the learned lr grows from 1e-3 and the meta-loss falls
    assert float(state.theta["log_lr"]) > np.log(1e-3) + 1.0
    early = np.mean([l["meta_loss"] for l in lines[:5]])
    late = np.mean([l["meta_loss"] for l in lines[-5:]])
    assert late < 0.8 * early
    # on fixed held-out tasks, 40 steps with the meta-trained theta end far lower than with the initial one
    trainer = ot.make_task_trainer(est.truncated_step.task_family, lo.opt_fn, 40)
    cfgs = jax.vmap(est.truncated_step.task_family.sample)(jax.random.split(jax.random.key(99), 16))
    keys = jax.random.split(jax.random.key(98), 16)
    before, _ = trainer(lo.init(jax.random.key(0)), cfgs, keys, None)
    after, _ = trainer(state.theta, cfgs, keys, None)
    assert float(after[:, -5:].mean()) < 0.6 * float(before[:, -5:].mean())
    loaded = lopt.load_theta(str(tmp_path / "theta_final.msgpack"), lo)
    np.testing.assert_allclose(loaded["log_lr"], state.theta["log_lr"])


def test_outer_train_same_seed_same_theta(quad_setup):
    lo, est = quad_setup
    learner = ot.GradientLearner(lo, optax.adam(0.1))
    a = ot.outer_train(learner, [est], num_steps=3, seed=1, progress=False)
    b = ot.outer_train(learner, [est], num_steps=3, seed=1, progress=False)
    np.testing.assert_array_equal(np.asarray(a.theta["log_lr"]), np.asarray(b.theta["log_lr"]))


def test_outer_train_continues_from_state(quad_setup):
    lo, est = quad_setup
    learner = ot.GradientLearner(lo, optax.adam(0.1))
    full = ot.outer_train(learner, [est], num_steps=4, seed=2, progress=False)
    half = ot.outer_train(learner, [est], num_steps=2, seed=2, progress=False)
    rest = ot.outer_train(learner, [est], num_steps=2, state=half, progress=False)
    assert rest.step == 4
    np.testing.assert_array_equal(np.asarray(full.theta["log_lr"]), np.asarray(rest.theta["log_lr"]))


def test_outer_train_needs_estimators(quad_setup):
    lo, _ = quad_setup
    with pytest.raises(ValueError, match="GradientEstimator"):
        ot.outer_train(ot.GradientLearner(lo, optax.adam(0.1)), [], num_steps=1)

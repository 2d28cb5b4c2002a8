import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lopt
import outer_trainers as ot
import tasks
from tests.fixtures import lopt_step, metrics_lines


@pytest.fixture(scope="module")
def quad_setup():
    lo = lopt.LearnableSGD(1e-3)
    step = lopt_step(8, lo, 40)
    est = ot.TruncatedPES(step, num_tasks=8, trunc_length=10, std=0.05, random_initial_iteration_offset=30)
    return lo, est


def test_outer_train_lowers_meta_loss(quad_setup, tmp_path):
    lo, est = quad_setup
    learner = ot.GradientLearner(lo, optax.adam(0.1))
    state = ot.outer_train(learner, [est], num_steps=30, output_dir=str(tmp_path),
                           reporting=ot.Reporting(progress=False))
    lines = metrics_lines(tmp_path)
    assert len(lines) == 30 and lines[-1]["step"] == 30
    for k in ("meta_loss", "grad_norm", "theta_norm", "inner_steps_per_s", "num_dropped"):
        assert k in lines[0]
    # the learned lr grows from 1e-3 and the meta-loss falls
    assert float(state.theta["log_lr"]) > np.log(1e-3) + 1.0
    # the per-step meta-loss is dominated by which tasks happen to be sampled, so compare the
    # meta-loss of the initial and final theta on the same particles and keys (40 inner steps)
    start = ot.init_outer_state(learner, [est], jax.random.key(0))

    def meta_loss(theta):
        s, losses = start.estimator_states[0], []
        for i in range(4):
            s, e = est.estimate(theta, s, jax.random.key(100 + i), outer_state=0)
            losses.append(float(e.loss))
        return np.mean(losses)

    assert meta_loss(state.theta) < 0.9 * meta_loss(start.theta)
    # on fixed held-out tasks, 40 steps with the meta-trained theta end far lower than with the initial one
    trainer = ot.make_task_trainer(est.truncated_step.task_family, lo.opt_fn, 40)
    cfgs = jax.vmap(est.truncated_step.task_family.sample)(jax.random.split(jax.random.key(99), 16))
    keys = jax.random.split(jax.random.key(98), 16)
    before, _ = trainer(lo.init(jax.random.key(0)), cfgs, keys, None)
    after, _ = trainer(state.theta, cfgs, keys, None)
    assert float(after[:, -5:].mean()) < 0.7 * float(before[:, -5:].mean())
    loaded = lopt.load_theta(str(tmp_path / "theta_final.msgpack"), lo)
    np.testing.assert_allclose(loaded["log_lr"], state.theta["log_lr"])


def test_outer_train_same_seed_same_theta(quad_setup):
    lo, est = quad_setup
    learner = ot.GradientLearner(lo, optax.adam(0.1))
    a = ot.outer_train(learner, [est], num_steps=3, seed=1, reporting=ot.Reporting(progress=False))
    b = ot.outer_train(learner, [est], num_steps=3, seed=1, reporting=ot.Reporting(progress=False))
    np.testing.assert_array_equal(np.asarray(a.theta["log_lr"]), np.asarray(b.theta["log_lr"]))


def test_outer_train_continues_from_state(quad_setup):
    lo, est = quad_setup
    learner = ot.GradientLearner(lo, optax.adam(0.1))
    full = ot.outer_train(learner, [est], num_steps=4, seed=2, reporting=ot.Reporting(progress=False))
    half = ot.outer_train(learner, [est], num_steps=2, seed=2, reporting=ot.Reporting(progress=False))
    rest = ot.outer_train(learner, [est], num_steps=2, state=half, reporting=ot.Reporting(progress=False))
    assert rest.step == 4
    np.testing.assert_array_equal(np.asarray(full.theta["log_lr"]), np.asarray(rest.theta["log_lr"]))


def test_outer_train_needs_estimators(quad_setup):
    lo, _ = quad_setup
    with pytest.raises(ValueError, match="GradientEstimator"):
        ot.outer_train(ot.GradientLearner(lo, optax.adam(0.1)), [], num_steps=1)


# ---- summaries, non-finite estimates, meta-evaluation ----------------------------------------------

from outer_trainers.runs.summaries import read_event_scalars  # noqa: E402


@pytest.fixture(scope="module")
def tiny():
    family = tasks.QuadraticFamily(dim=4)
    lo = lopt.LearnableSGD(1e-2)
    step = lopt_step(family, lo, 12)
    est = ot.TruncatedPES(step, num_tasks=2, trunc_length=4, std=0.05)
    evaluator = ot.MetaEvaluator(lo, [family], num_tasks=2, num_steps=10, seed=7)
    return lo, est, evaluator


def test_tensorboard_and_jsonl_carry_the_same_scalars(tiny, tmp_path, capsys):
    lo, est, evaluator = tiny
    learner = ot.GradientLearner(lo, optax.adam(0.05))
    ot.outer_train(learner, [est], 4, output_dir=str(tmp_path), reporting=ot.Reporting(progress="log"),
                   meta_evaluator=evaluator,
                   eval_every=2)
    lines = metrics_lines(tmp_path)
    tb = read_event_scalars(str(tmp_path / "tb"))
    expected = {"meta_loss", "grad_norm", "theta_norm", "inner_steps_per_s", "num_dropped", "num_dropped_total",
                "meta_loss/TruncatedPES/quadratic_dim4", "eval/quadratic_dim4/final_loss",
                "eval/quadratic_dim4/mean_loss", "eval/final_loss"}
    assert expected <= set(tb), sorted(tb)
    assert [s for s, _ in tb["meta_loss"]] == [1, 2, 3, 4]
    assert [s for s, _ in tb["eval/final_loss"]] == [2, 4]
    for line in lines:
        for k, v in line.items():
            if k != "step":
                assert dict(tb[k])[line["step"]] == pytest.approx(v, rel=1e-6)
    assert "step 4/4" in capsys.readouterr().err


def test_meta_evaluator_compiles_once_and_ranks_thetas(tiny, compile_counter):
    lo, _, evaluator = tiny
    slow = evaluator(lo.init(jax.random.key(0)))
    with compile_counter() as c:
        fast = evaluator({"log_lr": jnp.asarray(np.log(0.3), jnp.float32)})
    assert c.count == 0
    assert fast["eval/final_loss"] < 0.5 * slow["eval/final_loss"]
    assert set(fast) == {"eval/quadratic_dim4/final_loss", "eval/quadratic_dim4/mean_loss",
                         "eval/quadratic_dim4/eval_loss", "eval/final_loss", "eval/mean_loss", "eval/eval_loss"}


class NaNOnOddSteps(ot.GradientEstimator):
    """Wraps an estimator; its estimate (loss and grad) is NaN on odd outer iterations."""

    def __init__(self, inner):
        self.inner = inner
        super().__init__(inner.truncated_step)

    def _init_state(self, theta, key, outer_state, data):
        return self.inner._init_state(theta, key, outer_state, data)

    def _estimate(self, theta, state, key, outer_state, data):
        state, est = self.inner._estimate(theta, state, key, outer_state, data)
        bad = outer_state % 2 == 1
        nan = lambda x: jnp.where(bad, jnp.nan, x)
        return state, est.replace(loss=nan(est.loss), grad=jax.tree_util.tree_map(nan, est.grad))


def test_nonfinite_estimates_are_dropped_counted_and_logged(tiny, tmp_path):
    lo, est, _ = tiny
    learner = ot.GradientLearner(lo, optax.adam(0.05))
    with pytest.warns(RuntimeWarning, match="non-finite meta-loss or gradient"):
        state = ot.outer_train(learner, [NaNOnOddSteps(est)], 6, output_dir=str(tmp_path),
                               reporting=ot.Reporting(progress=False))
    assert state.step == 6 and int(state.learner_state.step) == 3  # only the finite updates applied
    assert np.isfinite(float(state.theta["log_lr"]))
    lines = metrics_lines(tmp_path)
    assert [l["num_dropped"] for l in lines] == [0, 1, 0, 1, 0, 1]
    assert [l["num_dropped_total"] for l in lines] == [0, 1, 1, 2, 2, 3]
    assert np.isfinite(lopt.load_theta(str(tmp_path / "theta_final.msgpack"))["log_lr"])
    tb = read_event_scalars(str(tmp_path / "tb"))
    assert [v for _, v in tb["num_dropped"]] == [0, 1, 0, 1, 0, 1]


def test_theta_from_checkpoint_of_an_averaging_run_is_its_average_or_with_last_its_theta(tiny, tmp_path):
    """With theta_ema the checkpoint's result is the moving average, as theta_final.msgpack holds it
    at that step, and which="last" gives theta itself (theta_last.msgpack)."""
    lo, est, _ = tiny
    learner = ot.GradientLearner(lo, optax.adam(0.1), theta_ema=0.5)
    state = ot.outer_train(learner, [est], 3, output_dir=str(tmp_path), reporting=ot.Reporting(progress=False))
    path = str(sorted((tmp_path / "checkpoints").glob("ckpt_*.msgpack"))[-1])
    _, avg = ot.theta_from_checkpoint(path)
    _, last = ot.theta_from_checkpoint(path, which="last")
    final, last_file = (lopt.load_theta(str(tmp_path / f)) for f in ("theta_final.msgpack", "theta_last.msgpack"))
    np.testing.assert_array_equal(avg["log_lr"], final["log_lr"])
    np.testing.assert_array_equal(last["log_lr"], last_file["log_lr"])
    np.testing.assert_array_equal(last["log_lr"], np.asarray(state.theta["log_lr"]))
    assert not np.array_equal(avg["log_lr"], last["log_lr"])  # the average lags theta


def test_theta_from_checkpoint_is_the_runs_theta(tiny, tmp_path):
    """A run's checkpoint gives back its learned optimizer and theta (what evaluate.py evaluates), and a
    file that is not an outer_train checkpoint is refused with the reason."""
    lo, est, _ = tiny
    learner = ot.GradientLearner(lo, optax.adam(0.1))
    state = ot.outer_train(learner, [est], 3, output_dir=str(tmp_path), reporting=ot.Reporting(progress=False))
    path = sorted((tmp_path / "checkpoints").glob("ckpt_*.msgpack"))[-1]
    got_lo, theta = ot.theta_from_checkpoint(str(path))
    assert got_lo.name == lo.name and got_lo.config() == lo.config()
    want = jax.tree_util.tree_map(np.asarray, state.theta)
    assert jax.tree_util.tree_structure(theta) == jax.tree_util.tree_structure(want)
    for a, b in zip(jax.tree_util.tree_leaves(theta), jax.tree_util.tree_leaves(want)):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="which must be 'result' or 'last'"):
        ot.theta_from_checkpoint(str(path), which="ema")
    ot.CheckpointManager(str(tmp_path / "other")).save(1, {"x": jnp.ones(3)}, {})
    with pytest.raises(ValueError, match="records no learned optimizer"):
        ot.theta_from_checkpoint(str(next((tmp_path / "other").glob("ckpt_*.msgpack"))))

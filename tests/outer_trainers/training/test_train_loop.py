"""train_loop: evaluation at the requested steps, checkpoints by policy, logs, TensorBoard, callbacks,
the generator form, EMA warm-up, any model, and bad arguments."""
import os
import subprocess
import sys

import chex
import flax.linen as nn
import jax
import numpy as np
import optax
import pytest

import lopt
import outer_trainers as ot
import tasks
from outer_trainers.runs.summaries import read_event_scalars
from outer_trainers.training.train_eval import EvalPlan, Evaluation
from outer_trainers.runs.summaries import Progress
from outer_trainers.training.train_loop import TRAIN_PROGRESS_FIELDS, param_count, train_loop
from outer_trainers.training.train_setup import LoopOptions
from outer_trainers.training.train_state import ema_decay_at
from tests.fixtures import metrics_lines

QUAD = tasks.QuadraticFamily(dim=4).task_fn(tasks.QuadraticFamily(dim=4).sample(jax.random.key(0)))
NO_TIME = dict(every_seconds=None)


@pytest.fixture(scope="module")
def mlp():
    return tasks.ImageMLPTask("digits", (8,), batch_size=32)


def _run(loop):
    """Runs a train_loop generator to the end: (yielded states, TrainResult)."""
    states = []
    while True:
        try:
            states.append(next(loop))
        except StopIteration as done:
            return states, done.value


def test_evaluates_a_data_free_task_at_the_requested_steps():
    r = ot.train_model(QUAD, optax.adam(0.1), 10, evaluation=ot.EvalPlan(every=4, at=(1,)))
    np.testing.assert_array_equal(r.eval_steps, [1, 4, 8, 10])
    assert list(r.evals) == ["eval/test/loss"]
    np.testing.assert_allclose(r.evals["eval/test/loss"][-1], QUAD.loss(r.state.params, None, None), rtol=1e-6)
    assert r.evals["eval/test/loss"][-1] < r.evals["eval/test/loss"][0]


@pytest.mark.slow
def test_evaluates_at_the_requested_steps_with_loss_accuracy_and_ema(mlp, tmp_path):
    out = str(tmp_path / "run")
    other = Evaluation("train", "small_batches", task=tasks.ImageMLPTask("digits", (8,), batch_size=16), num_batches=2)
    r = ot.train_model(mlp, optax.adam(1e-2), 12, ema_decay=0.9,
                       evaluation=ot.EvalPlan(evals=["test", Evaluation("outer_valid", "ov"), other], every=4,
                                              at=(0, 2)), output_dir=out,
                       options=ot.LoopOptions(log_every=100, tensorboard=False))
    np.testing.assert_array_equal(r.eval_steps, [0, 2, 4, 8, 12])
    names = {f"{p}/{label}/{m}" for p in ("eval", "eval_ema") for label in ("test", "ov", "small_batches")
             for m in ("loss", "accuracy")}
    assert set(r.evals) == names
    lines = metrics_lines(out)
    assert [line["step"] for line in lines] == [0, 2, 4, 8, 12]  # log_every=100: only eval steps and the end
    for line, row in zip(lines, range(5)):
        assert names <= set(line)
        for name in names:
            assert line[name] == pytest.approx(float(r.evals[name][row]), rel=1e-6)
    assert 0.0 <= r.evals["eval/test/accuracy"].min() and r.evals["eval/test/accuracy"].max() <= 1.0
    assert r.evals["eval/test/accuracy"][-1] > r.evals["eval/test/accuracy"][0]  # it learns
    assert r.evals["eval/test/loss"][0] == r.evals["eval_ema/test/loss"][0]  # same params before training
    assert r.eval_loss == r.evals["eval/test/loss"][-1] and r.ema_eval_loss == r.evals["eval_ema/test/loss"][-1]
    # the logged numbers are the metrics of the final params on the documented batches
    k_eval = jax.random.split(jax.random.key(0), 3)[2]

    @jax.jit
    def by_hand(p, ms):
        keys = jax.random.split(jax.random.fold_in(k_eval, 0), 8)
        batches = [mlp.data.batch(k, "test") for k in keys]
        acc = [tasks.accuracy(mlp.logits(p, b["image"], ms), b["label"]) for b in batches]
        loss = [mlp.loss_with_state(p, ms, k, b)[0] for k, b in zip(keys, batches)]
        return sum(acc) / 8, sum(loss) / 8

    np.testing.assert_allclose([r.evals["eval/test/accuracy"][-1], r.evals["eval/test/loss"][-1]],
                               by_hand(r.state.params, r.state.model_state), rtol=1e-5)


def test_permanent_checkpoints_are_kept_while_rolling_ones_rotate(tmp_path):
    policy = ot.CheckpointPolicy(every_steps=2, keep=2, checkpoints_at=(3,), permanent_every=4, **NO_TIME)
    out = tmp_path / "run"
    ot.train_model(QUAD, optax.adam(0.1), 10, output_dir=str(out), checkpoint_policy=policy,
                   options=ot.LoopOptions(tensorboard=False))
    mgr = ot.CheckpointManager(str(out / "checkpoints"), policy)
    assert [s for s, _ in mgr.list("rolling")] == [8, 10]
    assert [s for s, _ in mgr.list("permanent")] == [3, 4, 8]


def test_resume_restores_eval_history_and_ema_and_refuses_another_run(tmp_path):
    kw = dict(ema_decay=0.8, ema_warmup_steps=3, evaluation=ot.EvalPlan(every=3),
              options=ot.LoopOptions(chunk_size=4, tensorboard=False),
              checkpoint_policy=ot.CheckpointPolicy(every_steps=4, keep=5, **NO_TIME))
    straight = ot.train_model(QUAD, optax.adam(0.05), 10, **kw)
    out = tmp_path / "run"
    ot.train_model(QUAD, optax.adam(0.05), 10, output_dir=str(out), **kw)
    for step in (10, 8):  # as if killed after step 4's checkpoint
        os.remove(out / "checkpoints" / f"ckpt_{step:08d}.msgpack")
    resumed = ot.train_model(QUAD, optax.adam(0.05), 10, output_dir=str(out), **kw)
    np.testing.assert_array_equal(resumed.losses, straight.losses)
    chex.assert_trees_all_equal(resumed.state, straight.state)  # params, EMA, optimizer state, key
    chex.assert_trees_all_equal(resumed.evals, straight.evals)
    assert [line["step"] for line in metrics_lines(out)] == [0, 3, 6, 9, 10]  # the killed session's lines past 4 dropped
    with pytest.raises(ValueError, match="eval_steps"):
        ot.train_model(QUAD, optax.adam(0.05), 10, output_dir=str(out), **dict(kw, evaluation=ot.EvalPlan(every=5)))


@pytest.mark.slow
def test_tensorboard_has_train_eval_throughput_and_model_tags(mlp, tmp_path):
    out = str(tmp_path / "run")
    ot.train_model(mlp, optax.sgd(0.1), 6, ema_decay=0.5, evaluation=ot.EvalPlan(every=3),
                   options=ot.LoopOptions(log_every=2), output_dir=out)
    scalars = read_event_scalars(os.path.join(out, "tb"))
    for tag in ("train/loss", "train/grad_norm", "train/param_norm", "train/steps_per_s", "train/examples_per_s",
                "train/examples_per_s_per_device", "eval/test/loss", "eval/test/accuracy", "eval_ema/test/loss",
                "model/num_params", "model/param_bytes"):
        assert tag in scalars, (tag, sorted(scalars))
    assert [s for s, _ in scalars["train/loss"]] == [2, 3, 4, 6]  # log steps and eval steps
    assert [s for s, _ in scalars["eval/test/accuracy"]] == [3, 6]
    assert scalars["model/num_params"] == [(0, 64 * 8 + 8 + 8 * 10 + 10)]
    line = metrics_lines(out)[3]  # step 4: 32 examples per step
    assert line["step"] == 4 and line["train/examples_per_s"] == pytest.approx(32 * line["train/steps_per_s"])


def test_generator_yields_states_at_the_right_steps_and_callbacks_run_at_eval_and_checkpoint_steps(tmp_path):
    calls = []
    policy = ot.CheckpointPolicy(every_steps=5, keep=3, **NO_TIME)
    callback = lambda step, state, metrics: calls.append((step, int(state.step), sorted(metrics)))
    loop = train_loop(QUAD, optax.adam(0.1), 10, evaluation=EvalPlan(every=4, at=(0,)), output_dir=str(tmp_path),
                      checkpoint_policy=policy,
                      options=LoopOptions(yield_every=3, tensorboard=False, callbacks=[callback]))
    states, result = _run(loop)
    assert [int(s.step) for s in states] == [3, 6, 9, 10]
    chex.assert_trees_all_equal(states[-1], result.state)
    assert [c[0] for c in calls] == [0, 4, 5, 8, 10] and all(c[0] == c[1] for c in calls)
    assert "eval/test/loss" in calls[1][2] and "eval/test/loss" not in calls[2][2]
    # the yielded states are those of an uninterrupted train_model run
    straight = ot.train_model(QUAD, optax.adam(0.1), 10)
    chex.assert_trees_all_equal(result.state.params, straight.state.params)


def test_leaving_the_generator_early_keeps_its_checkpoint_and_a_rerun_resumes(tmp_path):
    policy = ot.CheckpointPolicy(every_steps=4, keep=3, **NO_TIME)
    kw = dict(output_dir=str(tmp_path), checkpoint_policy=policy)
    loop = train_loop(QUAD, optax.adam(0.1), 12, options=LoopOptions(yield_every=4, tensorboard=False), **kw)
    for state in loop:
        if int(state.step) == 8:
            break
    loop.close()
    assert os.path.exists(tmp_path / "checkpoints" / "ckpt_00000008.msgpack")
    states, result = _run(train_loop(QUAD, optax.adam(0.1), 12, options=LoopOptions(yield_every=4, tensorboard=False),
                                     **kw))
    assert [int(s.step) for s in states] == [12]
    np.testing.assert_array_equal(result.losses, ot.train_model(QUAD, optax.adam(0.1), 12).losses)


def test_ema_warmup_ramps_the_decay_in():
    np.testing.assert_allclose([ema_decay_at(t, 0.9, 4) for t in (1, 2, 4, 8)], [0.225, 0.45, 0.9, 0.9])
    assert float(ema_decay_at(1, 0.9)) == pytest.approx(0.9)
    tx = optax.sgd(0.1)
    one = ot.train_model(QUAD, tx, 1, ema_decay=0.9, ema_warmup_steps=4, evaluation=ot.EvalPlan(evals=()))
    init = ot.train_model(QUAD, tx, 0, evaluation=ot.EvalPlan(evals=())).state.params
    want = jax.tree_util.tree_map(lambda e, p: 0.225 * e + 0.775 * p, init, one.state.params)
    chex.assert_trees_all_close(one.state.ema_params, want, rtol=1e-6)
    assert np.isnan(one.eval_loss) and one.evals == {}


class _Linear(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(10)(x.reshape(x.shape[0], -1).astype(np.float32) / 16.0)


@pytest.mark.slow
def test_a_flax_classifier_gets_accuracy_and_a_learned_optimizer_trains_it(mlp):
    loss = lambda logits, batch: tasks.softmax_cross_entropy(logits, batch["label"])
    lo = lopt.MLPLOpt()
    tx = lo.opt_fn(lo.init(jax.random.key(0)), num_steps=8)
    r = ot.train_model(_Linear(), tx, 8, loss_fn=loss, data=mlp.data,
                       evaluation=ot.EvalPlan(at=(0,),
                                              metrics={"top_logit": lambda logits, batch: logits.max(-1).mean()}))
    assert set(r.evals) == {"eval/test/loss", "eval/test/accuracy", "eval/test/top_logit"}
    assert np.all(np.isfinite(r.losses)) and 0.0 <= r.evals["eval/test/accuracy"][-1] <= 1.0


def test_param_count_and_progress_log_lines(capsys):
    assert param_count({"w": np.zeros((3, 4), np.float32), "b": np.zeros(4, np.float16)}) == (16, 56)
    bar = Progress("log", total=10, desc="train", fields=TRAIN_PROGRESS_FIELDS)
    bar.update(5, {"train/loss": 0.5, "train/steps_per_s": 100.0, "train/examples_per_s": 3200.0})
    bar.update(1)
    err = capsys.readouterr().err
    assert "step 5/10 loss=0.5 steps/s=100 examples/s=3200 eta=" in err and err.count("\n") == 1
    bar = Progress("bar", total=10, initial=2, desc="train", fields=TRAIN_PROGRESS_FIELDS)
    bar.update(3, {"train/loss": 0.25, "train/steps_per_s": 10.0})
    bar.close()
    err = capsys.readouterr().err
    assert bar.n == 5 and "5/10" in err and "loss=0.25" in err and "steps/s=10" in err


def test_bad_arguments_fail_with_a_clear_message(mlp):
    tx = optax.adam(0.1)
    with pytest.raises(ValueError, match="eval_every must be >= 1"):
        ot.train_model(QUAD, tx, 4, evaluation=ot.EvalPlan(every=0))
    with pytest.raises(ValueError, match=r"eval_at steps must lie in \[0, num_steps=4\]"):
        ot.train_model(QUAD, tx, 4, evaluation=ot.EvalPlan(at=(5,)))
    with pytest.raises(ValueError, match="unknown split 'bogus'.*'digits' has splits"):
        ot.train_model(mlp, tx, 4, evaluation=ot.EvalPlan(evals=["test", "bogus"]))
    with pytest.raises(ValueError, match="labels must be unique"):
        ot.train_model(mlp, tx, 4, evaluation=ot.EvalPlan(evals=["test", Evaluation("outer_valid", "test")]))
    with pytest.raises(ValueError, match="best_metric 'eval/nope' is not a logged metric"):
        ot.train_model(QUAD, tx, 4, checkpoint_policy=ot.CheckpointPolicy(best_metric="eval/nope"))
    with pytest.raises(ValueError, match="params differ in structure"):
        wide = Evaluation("test", "wide", task=tasks.ImageMLPTask("digits", (9,)))
        ot.train_model(mlp, tx, 4, evaluation=ot.EvalPlan(evals=[wide]))
    with pytest.raises(ValueError, match="ema_decay must be in"):
        ot.train_model(QUAD, tx, 4, ema_decay=1.0)
    with pytest.raises(ValueError, match="yield_every must be >= 1"):
        train_loop(QUAD, tx, 4, options=LoopOptions(yield_every=0))  # raised at the call, before any iteration
    with pytest.raises(TypeError, match="iterate train_loop"):
        ot.train_model(QUAD, tx, 4, options=ot.LoopOptions(yield_every=2))


def _comparable(line):
    """A metrics.jsonl line without what depends on the session's timing."""
    return {k: v for k, v in line.items() if k != "elapsed_s" and "_per_s" not in k}


@pytest.mark.slow
def test_resume_after_sigkill_is_bit_identical_with_ema_and_eval_history(tmp_path):
    job = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train_job.py")
    run = lambda *a: subprocess.run([sys.executable, job, *map(str, a)], capture_output=True, text=True, timeout=300)
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    r = run(straight, 14)
    assert r.returncode == 0, r.stderr[-2000:]
    r = run(killed, 14, 12)  # after step 10's rolling and step 8's permanent checkpoint
    assert r.returncode == -9, (r.returncode, r.stderr[-2000:])  # a real SIGKILL
    assert not (killed / "result.npz").exists()
    assert max(line["step"] for line in metrics_lines(killed)) == 12
    r = run(killed, 14)
    assert r.returncode == 0, r.stderr[-2000:]
    a, b = np.load(straight / "result.npz"), np.load(killed / "result.npz")
    assert sorted(a.files) == sorted(b.files) and "eval_eval_ema/outer_valid/accuracy" in a.files
    for name in a.files:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    assert [_comparable(x) for x in metrics_lines(killed)] == [_comparable(x) for x in metrics_lines(straight)]
    assert [line["step"] for line in metrics_lines(killed)] == [0, 3, 4, 6, 8, 9, 12, 14]
    mgr = ot.CheckpointManager(str(killed / "checkpoints"))
    assert [s for s, _ in mgr.list("rolling")] == [10, 14] and [s for s, _ in mgr.list("permanent")] == [8]


def test_a_new_run_refuses_another_runs_results_unless_overwrite(tmp_path):
    out = str(tmp_path / "run")
    first = ot.train_model(QUAD, optax.adam(0.1), 4, output_dir=out, options=ot.LoopOptions(tensorboard=False))
    before = open(os.path.join(out, "metrics.jsonl")).read()
    with pytest.raises(ValueError, match="holds the results of a run"):
        ot.train_model(QUAD, optax.adam(0.1), 4, output_dir=out, resume=False)
    assert open(os.path.join(out, "metrics.jsonl")).read() == before  # a refused start changes nothing
    again = ot.train_model(QUAD, optax.adam(0.1), 4, output_dir=out, options=ot.LoopOptions(tensorboard=False),
                           overwrite=True, seed=1)
    assert not np.array_equal(again.losses, first.losses)
    assert open(os.path.join(out, "metrics.jsonl")).read() != before

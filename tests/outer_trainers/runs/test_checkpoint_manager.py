"""CheckpointManager: exact resume (in-process and after a real SIGKILL), partial/corrupt files ignored,
keep-last-k, permanent, time-based and best checkpoints, and mismatch errors."""
import json
import os
import subprocess
import sys

import chex
import jax.numpy as jnp
import optax
import pytest

import lopt
import outer_trainers as ot
from outer_trainers.runs import checkpoint_files as C

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import resume_job  # noqa: E402
from tests.fixtures import metrics_lines

NO_TIME = dict(every_seconds=None)


@pytest.fixture(scope="module")
def setup():
    return resume_job.build()


def _steps(path):
    return [json.loads(l)["step"] for l in open(path)]


def _theta_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def test_resume_in_process_is_exact_and_truncates_metrics(setup, tmp_path):
    learner, ests = setup
    policy = ot.CheckpointPolicy(every_steps=5, keep=2, **NO_TIME)
    straight = ot.outer_train(learner, ests, 8, seed=3, reporting=ot.Reporting(progress=False))
    out = str(tmp_path / "run")
    ot.outer_train(learner, ests, 5, output_dir=out, seed=3, reporting=ot.Reporting(progress=False),
                   checkpoint_policy=policy)
    # a killed run leaves lines past its last checkpoint, one of them cut short
    with open(os.path.join(out, "metrics.jsonl"), "a") as f:
        f.write(json.dumps({"step": 6, "meta_loss": 1.0}) + "\n" + '{"step": 7, "meta_')
    resumed = ot.outer_train(learner, ests, 8, output_dir=out, seed=3, reporting=ot.Reporting(progress=False),
                             checkpoint_policy=policy)
    assert resumed.step == 8
    chex.assert_trees_all_equal(resumed.theta, straight.theta)
    chex.assert_trees_all_equal(resumed.learner_state.opt_state, straight.learner_state.opt_state)
    assert _steps(os.path.join(out, "metrics.jsonl")) == list(range(1, 9))
    # re-running a finished run trains nothing and keeps the result
    again = ot.outer_train(learner, ests, 8, output_dir=out, seed=3, reporting=ot.Reporting(progress=False),
                           checkpoint_policy=policy)
    assert again.step == 8
    chex.assert_trees_all_equal(again.theta, straight.theta)


@pytest.mark.slow
def test_resume_after_sigkill_is_bit_identical(tmp_path):
    job = os.path.join(HERE, "resume_job.py")
    run = lambda *a: subprocess.run([sys.executable, job, *map(str, a)], capture_output=True, text=True,
                                    timeout=300)
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    r = run(straight, 20)
    assert r.returncode == 0, r.stderr[-2000:]
    r = run(killed, 20, 12)
    assert r.returncode == -9, (r.returncode, r.stderr[-2000:])  # a real SIGKILL
    assert not (killed / "theta_final.msgpack").exists()
    assert _steps(killed / "metrics.jsonl") == list(range(1, 13))
    r = run(killed, 20)
    assert r.returncode == 0, r.stderr[-2000:]
    assert _theta_bytes(killed / "theta_final.msgpack") == _theta_bytes(straight / "theta_final.msgpack")
    assert _steps(killed / "metrics.jsonl") == list(range(1, 21))


def test_partial_and_corrupt_checkpoints_are_ignored(setup, tmp_path):
    learner, ests = setup
    policy = ot.CheckpointPolicy(every_steps=2, keep=5, **NO_TIME)
    out = tmp_path / "run"
    ot.outer_train(learner, ests, 4, output_dir=str(out), seed=0, reporting=ot.Reporting(progress=False),
                   checkpoint_policy=policy)
    ck = out / "checkpoints"
    good = (ck / "ckpt_00000004.msgpack").read_bytes()
    (ck / ".tmp-abcckpt_00000006.msgpack").write_bytes(good[: len(good) // 2])  # killed mid-write
    (ck / "ckpt_00000008.msgpack").write_bytes(good[: len(good) // 3])  # cut short under its final name
    mgr = ot.CheckpointManager(str(ck))
    with pytest.warns(UserWarning, match="unreadable checkpoint"):
        assert mgr.latest().endswith("ckpt_00000004.msgpack")
    with pytest.warns(UserWarning, match="unreadable checkpoint"):
        state = ot.outer_train(learner, ests, 4, output_dir=str(out), seed=0, reporting=ot.Reporting(progress=False),
                               checkpoint_policy=policy)
    assert state.step == 4


def test_keep_last_k_and_permanent(setup, tmp_path):
    learner, ests = setup
    policy = ot.CheckpointPolicy(every_steps=1, keep=2, checkpoints_at=(2,), permanent_every=5, **NO_TIME)
    out = tmp_path / "run"
    ot.outer_train(learner, ests, 7, output_dir=str(out), seed=0, reporting=ot.Reporting(progress=False),
                   checkpoint_policy=policy)
    mgr = ot.CheckpointManager(str(out / "checkpoints"), policy)
    assert [s for s, _ in mgr.list("rolling")] == [6, 7]
    assert [s for s, _ in mgr.list("permanent")] == [2, 5]


def test_time_based_policy():
    mgr = ot.CheckpointManager("/nonexistent", ot.CheckpointPolicy(every_seconds=10.0))
    mgr.mark_time(100.0)
    assert mgr.due(1, 105.0) == [] and mgr.due(2, 111.0) == ["rolling"]
    assert mgr.due(3, 112.0, final=True) == ["rolling"]


def test_best_checkpoints_by_metric(setup, tmp_path):
    learner, ests = setup
    values = {2: 3.0, 4: 1.0, 6: 2.0, 8: 0.5, 10: 4.0}
    evaluator = lambda theta, it=iter(values.values()): {"eval/final_loss": next(it)}
    out = tmp_path / "run"
    policy = ot.CheckpointPolicy(best_metric="eval/final_loss", best_mode="min", keep_best=2, **NO_TIME)
    ot.outer_train(learner, ests, 10, output_dir=str(out), seed=0, reporting=ot.Reporting(progress=False),
                   checkpoint_policy=policy,
                   meta_evaluator=evaluator, eval_every=2)
    mgr = ot.CheckpointManager(str(out / "checkpoints"), policy)
    assert [s for s, _ in mgr.list("best")] == [4, 8]
    assert mgr.best_value == 0.5
    lines = metrics_lines(out)
    assert [l["eval/final_loss"] for l in lines if "eval/final_loss" in l] == list(values.values())
    # "max" keeps the highest
    mx = ot.CheckpointManager(str(tmp_path / "mx"), ot.CheckpointPolicy(best_metric="acc", best_mode="max"))
    state = {"x": jnp.zeros(2)}
    assert mx.save_best(1, state, 0.5) and mx.save_best(2, state, 0.7) and not mx.save_best(3, state, 0.6)
    assert not mx.save_best(4, state, float("nan"))
    assert [s for s, _ in mx.list("best")] == [2]


def test_mismatched_architecture_or_config_fails(setup, tmp_path):
    learner, ests = setup
    out = str(tmp_path / "run")
    policy = ot.CheckpointPolicy(every_steps=1, **NO_TIME)
    ot.outer_train(learner, ests, 1, output_dir=out, reporting=ot.Reporting(progress=False), checkpoint_policy=policy,
                   config={"gin_bindings": ["TruncatedPES.std = 0.05"]})
    other_lr = ot.GradientLearner(lopt.LearnableSGD(3e-2), optax.adam(0.05))
    with pytest.raises(ValueError, match=r"lopt_config \(learning_rate: saved 0.01, here 0.03"):
        ot.outer_train(other_lr, ests, 2, output_dir=out, reporting=ot.Reporting(progress=False),
                       checkpoint_policy=policy,
                       config={"gin_bindings": ["TruncatedPES.std = 0.05"]})
    other_arch = ot.GradientLearner(lopt.LearnableSGDM(1e-2), optax.adam(0.05))
    with pytest.raises(ValueError, match="architecture.*LearnableSGD.*LearnableSGDM"):
        ot.outer_train(other_arch, ests, 2, output_dir=out, reporting=ot.Reporting(progress=False),
                       checkpoint_policy=policy,
                       config={"gin_bindings": ["TruncatedPES.std = 0.05"]})
    with pytest.raises(ValueError, match=r"only in checkpoint: \['TruncatedPES.std = 0.05'\]"):
        ot.outer_train(learner, ests, 2, output_dir=out, reporting=ot.Reporting(progress=False),
                       checkpoint_policy=policy,
                       config={"gin_bindings": ["TruncatedPES.std = 0.1"]})
    # a state of another shape is named too, even when the metadata agrees
    mgr = ot.CheckpointManager(os.path.join(out, "checkpoints"))
    with pytest.raises(ValueError, match="another structure"):
        C.restore(mgr.latest(), {"theta": jnp.zeros(3)})

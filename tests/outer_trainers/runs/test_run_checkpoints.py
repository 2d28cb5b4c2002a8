"""RunCheckpoints without a loop: restore-or-init, metadata checks, totals, best checkpoints, refusals and overwrite."""
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lopt
import outer_trainers as ot
from outer_trainers.runs.reporting import RunTotals
from outer_trainers.learner.run_records import run_metadata
from outer_trainers.runs.run_checkpoints import CHECKPOINT_DIR, ExistingRunError, RunCheckpoints


def _init(key):
    return {"theta": jax.random.normal(key, (3,)), "step": jnp.zeros((), jnp.int32)}


@pytest.fixture(scope="module")
def meta():
    return run_metadata(ot.GradientLearner(lopt.LearnableSGD(0.1), optax.adam(0.1)), ["estimator A"],
                        config={"b": 1, "a": [1, 2]})


def test_run_metadata(meta):
    assert meta == {"architecture": "LearnableSGD", "lopt_config": lopt.LearnableSGD(0.1).config(),
                    "estimators": ["estimator A"], "config": {"a": [1, 2], "b": 1}}


def test_without_output_dir_it_initialises_and_saves_nothing(meta):
    run = RunCheckpoints(None, meta=meta)
    state, totals = run.restore_or_init(_init, jax.random.key(0))
    np.testing.assert_array_equal(state["theta"], _init(jax.random.key(0))["theta"])
    assert totals == RunTotals() and run.newest_step() is None
    run.save(1, state, totals, final=True)


def test_restore_or_init_resumes_the_newest_matching_checkpoint(meta, tmp_path):
    policy = ot.CheckpointPolicy(every_steps=2, every_seconds=None, best_metric="eval", keep_best=1)
    run = RunCheckpoints(str(tmp_path), policy, meta)
    state = _init(jax.random.key(1))
    for step in (1, 2, 3):
        state = dict(state, step=jnp.asarray(step, jnp.int32))
        run.save(step, state, RunTotals(float(step), step), {"eval": 1.0 / step} if step < 3 else None,
                 final=step == 3)
    mgr = ot.CheckpointManager(str(tmp_path / CHECKPOINT_DIR), policy)
    assert [s for s, _ in mgr.list("rolling")] == [2, 3] and [s for s, _ in mgr.list("best")] == [2]
    again = RunCheckpoints(str(tmp_path), policy, meta)
    assert again.newest_step() == 3
    restored, totals = again.restore_or_init(_init, jax.random.key(7))
    assert int(restored["step"]) == 3 and totals == RunTotals(3.0, 3)
    np.testing.assert_array_equal(restored["theta"], state["theta"])
    with pytest.raises(ValueError, match="does not match this run"):
        RunCheckpoints(str(tmp_path), policy, dict(meta, estimators=["B"])).restore_or_init(_init, jax.random.key(7))


def test_a_new_run_over_results_is_refused_unless_overwrite(meta, tmp_path):
    policy = ot.CheckpointPolicy(every_steps=1, every_seconds=None, best_metric="eval")
    run = RunCheckpoints(str(tmp_path), policy, meta)
    run.save(1, _init(jax.random.key(1)), RunTotals(), {"eval": 0.5})
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    (tmp_path / "notes.txt").write_text("mine")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    again = RunCheckpoints(str(tmp_path), policy, meta)
    with pytest.raises(ExistingRunError, match=r"\(checkpoints, metrics.jsonl\) and resume=False.*overwrite=True"):
        again.restore_or_init(_init, jax.random.key(7), resume=False)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # a refusal changes nothing
    assert again.check_start() == 1
    fresh, totals = again.restore_or_init(_init, jax.random.key(7), overwrite=True)
    assert int(fresh["step"]) == 0 and totals == RunTotals()
    assert sorted(os.listdir(tmp_path)) == ["notes.txt"]  # only lopt's own results are deleted
    assert again.manager.best_value is None and again.manager.save_best(1, fresh, 0.9)  # the old best is forgotten

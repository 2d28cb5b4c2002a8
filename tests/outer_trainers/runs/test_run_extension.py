"""Training a run further, without a loop: what a resume with and without `extend` may change, which
bindings are horizons, the config history written to later checkpoints, and refusals that change nothing."""
import os

import jax
import jax.numpy as jnp
import pytest

import outer_trainers as ot
from outer_trainers.runs.checkpoint_files import read
from outer_trainers.runs.reporting import RunTotals
from outer_trainers.runs.run_checkpoints import RunCheckpoints, config_history
from outer_trainers.runs.run_extension import HISTORY_KEY, check_resume, is_horizon_binding, without_horizon

BINDINGS = ["fit.num_steps = 40", "learned_optimizer.num_steps = 40", "optax.adam.learning_rate = 0.1",
            "optax.cosine_decay_schedule.decay_steps = 40"]
SAVED = {"task": "q", "num_steps": 40, "eval_steps": [10, 40], "config": {"gin_bindings": BINDINGS}}


def _longer(n=60, **changes):
    bindings = [b.replace("40", str(n)) if is_horizon_binding(b) else b for b in BINDINGS]
    return dict(SAVED, num_steps=n, eval_steps=[10, n], config={"gin_bindings": bindings}, **changes)


def test_horizon_bindings_are_lengths_and_schedule_lengths():
    assert [is_horizon_binding(b) for b in BINDINGS] == [True, True, False, True]
    assert is_horizon_binding("NUM_STEPS = 3") and is_horizon_binding("scope/optax.linear_schedule.transition_steps=5")
    assert not is_horizon_binding("train.num_steps_per_eval = 3") and not is_horizon_binding("fit.eval_at = (40,)")
    assert without_horizon(SAVED, ("eval_steps",)) == {"task": "q", "config": {"gin_bindings": [BINDINGS[2]]}}


def test_a_resume_matches_exactly_unless_extended():
    assert check_resume("ck", SAVED, SAVED, 40) is None and check_resume("ck", SAVED, SAVED, 20, extend=True) is None
    with pytest.raises(ValueError, match=r"num_steps \(saved 40, here 60\).*To train this run further, to "
                                         r"num_steps=60, pass extend=True.*--extend"):
        check_resume("ck", SAVED, _longer(), 40, horizon_keys=("eval_steps",))
    entry = check_resume("ck", SAVED, _longer(), 40, extend=True, horizon_keys=("eval_steps",))
    assert {k: entry[k] for k in ("from_steps", "to_steps", "at_step")} == {"from_steps": 40, "to_steps": 60,
                                                                           "at_step": 40}
    assert [c.split(" ")[0] for c in entry["changed"]] == ["eval_steps", "config"]
    assert "only here: ['fit.num_steps = 60', 'learned_optimizer.num_steps = 60'" in entry["changed"][1]


def test_an_extension_refuses_fewer_steps_than_taken_and_changes_outside_the_horizon():
    with pytest.raises(ValueError, match=r"to num_steps=30: it has already taken 35 steps.*num_steps >= 35"):
        check_resume("ck", SAVED, _longer(30), 35, extend=True, horizon_keys=("eval_steps",))
    assert check_resume("ck", SAVED, _longer(36), 35, extend=True, horizon_keys=("eval_steps",))["to_steps"] == 36
    other = _longer(task="other")
    for extend in (False, True):  # more than the horizon differs: extending would not help, and is not advised
        with pytest.raises(ValueError, match=r"task \(saved 'q', here 'other'\)") as info:
            check_resume("ck", SAVED, other, 40, extend=extend, horizon_keys=("eval_steps",))
        assert "extend=True" not in str(info.value)


def test_a_free_length_resumes_to_any_length_and_records_it():
    entry = check_resume("ck", SAVED, dict(SAVED, num_steps=60), 40, fixed_length=False)
    assert (entry["from_steps"], entry["to_steps"], entry["changed"]) == (40, 60, [])
    assert check_resume("ck", SAVED, dict(SAVED, num_steps=30), 40, fixed_length=False) is None  # trains nothing
    with pytest.raises(ValueError, match="already taken 40 steps"):
        check_resume("ck", SAVED, dict(SAVED, num_steps=30), 40, fixed_length=False, extend=True)
    with pytest.raises(ValueError, match=r"decay_steps = 60.*pass extend=True"):  # horizon bindings need the flag
        check_resume("ck", SAVED, dict(_longer(), eval_steps=[10, 40]), 40, fixed_length=False)
    # a checkpoint written before runs recorded their length resumes to any length, as then
    legacy = {k: v for k, v in SAVED.items() if k != "num_steps"}
    assert check_resume("ck", legacy, dict(SAVED, num_steps=99), 40) is None


def _init(key):
    return {"theta": jax.random.normal(key, (3,)), "step": jnp.zeros((), jnp.int32)}


def _files(root):
    return {os.path.relpath(os.path.join(d, n), root): open(os.path.join(d, n), "rb").read()
            for d, _, names in os.walk(root) for n in names}


def test_the_config_history_goes_with_every_later_checkpoint(tmp_path):
    policy = ot.CheckpointPolicy(every_steps=1, every_seconds=None, keep=10)
    first = RunCheckpoints(str(tmp_path), policy, {"num_steps": 2})
    state, totals = first.restore_or_init(_init, jax.random.key(0))
    first.save(2, dict(state, step=jnp.asarray(2, jnp.int32)), totals, final=True)
    before = _files(tmp_path)
    for kwargs, error in (({}, "extend=True"), ({"extend": True, "overwrite": True}, "cannot be combined")):
        with pytest.raises(ValueError, match=error):
            RunCheckpoints(str(tmp_path), policy, {"num_steps": 5}).restore_or_init(_init, jax.random.key(0), **kwargs)
    assert _files(tmp_path) == before and config_history(str(tmp_path)) == []

    longer = RunCheckpoints(str(tmp_path), policy, {"num_steps": 5})
    assert longer.check_start(extend=True) == 2 and longer.history == []  # a check records nothing
    state, totals = longer.restore_or_init(_init, jax.random.key(0), extend=True)
    assert int(state["step"]) == 2 and longer.resumed_meta["num_steps"] == 2
    assert longer.history == [longer.extension] and longer.extension["to_steps"] == 5
    assert config_history(str(tmp_path)) == []  # recorded with the extension's first checkpoint, not before
    longer.save(3, dict(state, step=jnp.asarray(3, jnp.int32)), RunTotals())
    assert config_history(str(tmp_path)) == [longer.extension]

    again = RunCheckpoints(str(tmp_path), policy, {"num_steps": 5})  # the interrupted extension, rerun
    again.restore_or_init(_init, jax.random.key(0), extend=True)
    assert again.extension is None and again.history == [longer.extension]
    again.save(5, dict(state, step=jnp.asarray(5, jnp.int32)), RunTotals(), final=True)
    further = RunCheckpoints(str(tmp_path), policy, {"num_steps": 8})
    further.restore_or_init(_init, jax.random.key(0), extend=True)
    further.save(6, state, RunTotals())
    history = read(os.path.join(tmp_path, "checkpoints", "ckpt_00000006.msgpack"))["meta"][HISTORY_KEY]
    assert [(e["from_steps"], e["to_steps"], e["at_step"]) for e in history] == [(2, 5, 2), (5, 8, 5)]

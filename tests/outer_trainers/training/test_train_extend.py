"""Training a finished or interrupted run further (`extend=True`): refused without the flag and for fewer
steps than taken (nothing on disk changes), equal to a run started longer for a horizon-free optimizer,
the documented rule for schedules over num_steps (optax and a learned optimizer's horizon), the config
history, and an extension killed with SIGKILL resumes bit for bit."""
import os
import subprocess
import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lopt
import outer_trainers as ot
import tasks
from outer_trainers.runs.run_checkpoints import config_history
from tests.fixtures import metrics_lines

QUAD = tasks.QuadraticFamily(dim=4).task_fn(tasks.QuadraticFamily(dim=4).sample(jax.random.key(0)))
KW = dict(evaluation=ot.EvalPlan(every=10), options=ot.LoopOptions(chunk_size=8, tensorboard=False), ema_decay=0.9)
JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train_job.py")


def _files(root) -> dict:
    """{relative path: bytes} of every file under `root`."""
    return {os.path.relpath(os.path.join(d, n), root): open(os.path.join(d, n), "rb").read()
            for d, _, names in os.walk(root) for n in names}


def _same_result(a, b):
    np.testing.assert_array_equal(a.losses, b.losses)
    np.testing.assert_array_equal(a.grad_norms, b.grad_norms)
    np.testing.assert_array_equal(a.eval_steps, b.eval_steps)
    chex.assert_trees_all_equal(a.state, b.state)  # params, EMA, optimizer state, step, key
    chex.assert_trees_all_equal(a.evals, b.evals)


def test_extending_a_finished_run_is_refused_without_the_flag_and_equals_a_longer_run_with_it(tmp_path):
    out = str(tmp_path / "run")
    ot.train_model(QUAD, optax.adam(0.05), 40, output_dir=out, **KW)
    before = _files(out)
    with pytest.raises(ValueError, match=r"does not match this run: num_steps \(saved 40, here 60\).*extend=True.*"
                                         r"--extend"):
        ot.train_model(QUAD, optax.adam(0.05), 60, output_dir=out, **KW)
    with pytest.raises(ValueError, match=r"cannot extend .* to num_steps=30: it has already taken 40 steps"):
        ot.train_model(QUAD, optax.adam(0.05), 30, output_dir=out, extend=True, **KW)
    with pytest.raises(ValueError, match=r"does not match this run: .*learning_rate"):  # not only the horizon
        ot.train_model(QUAD, optax.adam(0.05), 60, output_dir=out, extend=True, config={"learning_rate": 0.1}, **KW)
    assert _files(out) == before  # every refusal leaves the run as it was
    assert config_history(out) == []

    extended = ot.train_model(QUAD, optax.adam(0.05), 60, output_dir=out, extend=True, **KW)
    straight = ot.train_model(QUAD, optax.adam(0.05), 60, **KW)
    _same_result(extended, straight)  # a horizon-free optimizer: bit-identical to a run started with 60 steps
    [entry] = config_history(out)
    assert (entry["from_steps"], entry["to_steps"], entry["at_step"]) == (40, 60, 40)
    assert entry["time"].endswith("+00:00") and entry["changed"][0].startswith("eval_steps")
    # the 40-step run's lines stay (its last step logged and evaluated); the extension's follow them
    assert [line["step"] for line in metrics_lines(out)] == [0, 10, 20, 30, 40, 50, 60]
    # a finished extension resumes as any finished run, with or without the flag, and records nothing more
    for extend in (False, True):
        again = ot.train_model(QUAD, optax.adam(0.05), 60, output_dir=out, extend=extend, **KW)
        _same_result(again, straight)
    assert len(config_history(out)) == 1


def test_an_interrupted_run_is_extended_from_its_newest_checkpoint(tmp_path):
    out = tmp_path / "run"
    kw = dict(KW, checkpoint_policy=ot.CheckpointPolicy(every_steps=10, keep=5, every_seconds=None))
    ot.train_model(QUAD, optax.adam(0.05), 40, output_dir=str(out), **kw)
    for step in (40, 30):  # as if killed after step 20's checkpoint
        os.remove(out / "checkpoints" / f"ckpt_{step:08d}.msgpack")
    extended = ot.train_model(QUAD, optax.adam(0.05), 60, output_dir=str(out), extend=True, **kw)
    _same_result(extended, ot.train_model(QUAD, optax.adam(0.05), 60, **KW))
    [entry] = config_history(str(out))
    assert (entry["from_steps"], entry["to_steps"], entry["at_step"]) == (40, 60, 20)


def test_extend_cannot_start_a_new_run():
    for kwargs in ({"overwrite": True}, {"resume": False}):
        with pytest.raises(ValueError, match="extend=True trains an existing run further"):
            ot.train_loop(QUAD, optax.adam(0.05), 4, extend=True, **kwargs)


def _spliced(before, after, at):
    """The rule of an extension at step `at`, as one schedule: `before`'s values for steps < at, `after`'s later."""
    return lambda count: jnp.where(count < at, before(count), after(count))


def test_a_learning_rate_schedule_over_num_steps_continues_with_the_new_horizon(tmp_path):
    """Cosine decay over 40 steps, extended to 60 with a cosine decay over 60: steps 1-40 decayed over 40, the
    later ones take the 60-step schedule's values at their step (step 41: lr/4, up from ~0)."""
    cos = lambda n: optax.cosine_decay_schedule(0.2, decay_steps=n)
    out = str(tmp_path / "run")
    ot.train_model(QUAD, optax.sgd(cos(40)), 40, output_dir=out, **KW)
    extended = ot.train_model(QUAD, optax.sgd(cos(60)), 60, output_dir=out, extend=True, **KW)
    rule = ot.train_model(QUAD, optax.sgd(_spliced(cos(40), cos(60), 40)), 60, **KW)
    _same_result(extended, rule)
    assert float(cos(40)(39)) < 1e-3 and float(cos(60)(40)) == pytest.approx(0.05)
    started_longer = ot.train_model(QUAD, optax.sgd(cos(60)), 60, **KW)
    assert not np.array_equal(extended.losses, started_longer.losses)  # the first 40 steps decayed faster


def test_a_learned_optimizers_horizon_continues_with_the_new_num_steps(tmp_path):
    """opt_fn(theta, num_steps=N): its state holds the iteration, not N; extended with num_steps=60, the steps
    after 40 see the progress features of a 60-step horizon (min(t/60, 1)), the first 40 those of 40."""
    lo = lopt.MLPLOpt(hidden_size=4, hidden_layers=1, use_num_steps=True)
    theta = jax.tree_util.tree_map(lambda x: x + 0.1, lo.init(jax.random.key(1)))  # so that progress matters
    out = str(tmp_path / "run")
    ot.train_model(QUAD, lo.opt_fn(theta, num_steps=40), 40, output_dir=out, **KW)
    extended = ot.train_model(QUAD, lo.opt_fn(theta, num_steps=60), 60, output_dir=out, extend=True, **KW)

    def update(grads, state, params=None, **extra):  # the rule, as one transform over 60 steps
        horizon = jnp.where(state.iteration < 40, 40, 60)
        return lo.opt_fn(theta, num_steps=horizon).update(grads, state, params, **extra)

    spliced = optax.GradientTransformationExtraArgs(lo.opt_fn(theta).init, update)
    rule = ot.train_model(QUAD, spliced, 60, **KW)
    _same_result(extended, rule)
    started_longer = ot.train_model(QUAD, lo.opt_fn(theta, num_steps=60), 60, **KW)
    moved = jax.tree_util.tree_map(lambda a, b: float(jnp.max(jnp.abs(a - b))), extended.state.params,
                                   started_longer.state.params)
    assert max(jax.tree_util.tree_leaves(moved)) > 1e-4  # the first 40 steps saw the shorter horizon


def _job(*args):
    return subprocess.run([sys.executable, JOB, *map(str, args)], capture_output=True, text=True, timeout=300)


def _comparable(line):
    """A metrics.jsonl line without what depends on the session's timing."""
    return {k: v for k, v in line.items() if k != "elapsed_s" and "_per_s" not in k}


@pytest.mark.slow
def test_an_extension_killed_with_sigkill_resumes_bit_identically(tmp_path):
    """train_job.py's run of 14 steps extended to 20: once uninterrupted, once SIGKILLed at step 16 (after the
    extension's rolling checkpoint at 15) and rerun; both equal, and equal to a run of 20 steps from the start."""
    straight, once, killed = tmp_path / "straight", tmp_path / "once", tmp_path / "killed"
    for out in (once, killed):
        r = _job(out, 14)
        assert r.returncode == 0, r.stderr[-2000:]
    r = _job(killed, 20)
    assert r.returncode != 0 and "does not match this run: num_steps (saved 14, here 20)" in r.stderr
    r = _job(killed, 20, 16, "--extend")
    assert r.returncode == -9, (r.returncode, r.stderr[-2000:])  # a real SIGKILL
    assert max(line["step"] for line in metrics_lines(killed)) == 16
    for out, args in ((killed, (20, "--extend")), (once, (20, "--extend")), (straight, (20,))):
        r = _job(out, *args)
        assert r.returncode == 0, r.stderr[-2000:]
    a, b, c = (np.load(out / "result.npz") for out in (once, killed, straight))
    assert sorted(a.files) == sorted(b.files) == sorted(c.files)
    for name in a.files:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
        np.testing.assert_array_equal(a[name], c[name], err_msg=name)  # Adam: as if started with 20 steps
    assert [_comparable(x) for x in metrics_lines(killed)] == [_comparable(x) for x in metrics_lines(once)]
    assert [line["step"] for line in metrics_lines(killed)] == [0, 3, 4, 6, 8, 9, 12, 14, 15, 16, 18, 20]
    assert [(e["from_steps"], e["to_steps"], e["at_step"]) for e in config_history(str(killed))] == [(14, 20, 14)]

"""Meta-training further: a finished run extended to more outer steps equals a run started longer (constant
outer learning rate), the rule for an outer schedule over the run's length, the config history, refusals
that change nothing (fewer steps than taken; the Ray path before Ray starts), and an extension SIGKILLed
and rerun resumes bit for bit."""
import os
import subprocess
import sys

import chex
import jax
import jax.numpy as jnp
import optax
import pytest

import outer_trainers as ot
from outer_trainers.runs.run_checkpoints import config_history
from tests.fixtures import metrics_lines
from tests.outer_trainers.distributed.runs import quadratic_run
from tests.outer_trainers.runs import resume_job

POLICY = ot.CheckpointPolicy(every_steps=2, every_seconds=None, keep=5)
JOB = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "runs", "resume_job.py")


@pytest.fixture(scope="module")
def setup():
    return resume_job.build()


def _files(root) -> dict:
    return {os.path.relpath(os.path.join(d, n), root): open(os.path.join(d, n), "rb").read()
            for d, _, names in os.walk(root) for n in names}


def _train(learner, ests, num_steps, out=None, **kwargs):
    return ot.outer_train(learner, ests, num_steps, output_dir=out, seed=3,
                          reporting=ot.Reporting(progress=False, tensorboard=False), checkpoint_policy=POLICY, **kwargs)


def test_a_finished_run_extended_equals_a_run_started_longer(setup, tmp_path):
    learner, ests = setup
    straight = _train(learner, ests, 8)
    for extend in (True, False):  # explicit, or a larger num_steps as meta-training has always allowed
        out = str(tmp_path / f"run_{extend}")
        _train(learner, ests, 4, out)
        before = _files(out)
        with pytest.raises(ValueError, match=r"to num_steps=3: it has already taken 4 steps"):
            _train(learner, ests, 3, out, extend=True)
        assert _files(out) == before  # refused: nothing changed on disk
        extended = _train(learner, ests, 8, out, extend=extend)
        chex.assert_trees_all_equal(extended, straight)  # theta, outer optimizer state, particles, key, step
        assert [line["step"] for line in metrics_lines(out)] == list(range(1, 9))
        [entry] = config_history(out)
        assert (entry["from_steps"], entry["to_steps"], entry["at_step"], entry["changed"]) == (4, 8, 4, [])
        again = _train(learner, ests, 8, out, extend=True)  # a finished extension: nothing more is recorded
        chex.assert_trees_all_equal(again.theta, straight.theta)
        assert len(config_history(out)) == 1


def test_an_outer_schedule_over_the_run_continues_with_the_new_horizon(setup, tmp_path):
    """Outer Adam with a cosine decay over 4 steps, extended to 8 with one over 8: steps 1-4 decayed over 4,
    steps 5-8 take the 8-step schedule's values at their step."""
    learner, ests = setup
    cos = lambda n: optax.cosine_decay_schedule(0.05, decay_steps=n)
    with_lr = lambda schedule: ot.GradientLearner(learner.learned_opt, optax.adam(schedule))
    out = str(tmp_path / "run")
    _train(with_lr(cos(4)), ests, 4, out)
    extended = _train(with_lr(cos(8)), ests, 8, out, extend=True)
    rule = _train(with_lr(lambda count: jnp.where(count < 4, cos(4)(count), cos(8)(count))), ests, 8)
    chex.assert_trees_all_equal(extended, rule)
    longer = _train(with_lr(cos(8)), ests, 8)
    assert float(jnp.abs(extended.theta["log_lr"] - longer.theta["log_lr"])) > 0  # steps 1-4 decayed faster


def test_extend_cannot_start_a_new_run_or_continue_a_given_state(setup, tmp_path):
    learner, ests = setup
    with pytest.raises(ValueError, match="cannot be combined with overwrite=True"):
        _train(learner, ests, 2, str(tmp_path / "run"), extend=True, overwrite=True)
    with pytest.raises(ValueError, match="with state= there is nothing to resume"):
        _train(learner, ests, 2, extend=True, state=ot.init_outer_state(learner, ests, jax.random.key(0)))
    assert not os.path.exists(tmp_path / "run")


def test_the_ray_learner_refuses_a_bad_extension_before_ray_starts(tmp_path, monkeypatch):
    """`ray_outer_train` checks the run's directory (length included) before it connects to Ray."""
    import outer_trainers.distributed.learner as distributed
    learner, ests = quadratic_run(num_estimators=1)
    out = str(tmp_path / "run")
    ot.outer_train(learner, ests, 3, output_dir=out, seed=0, reporting=ot.Reporting(progress=False, tensorboard=False))
    before = _files(out)
    monkeypatch.setattr(distributed, "connect_ray", lambda *a, **k: pytest.fail("Ray was started"))
    with pytest.raises(ValueError, match=r"to num_steps=2: it has already taken 3 steps"):
        ot.ray_outer_train(lambda: quadratic_run(num_estimators=1), 2, num_workers=1, output_dir=out, progress=False,
                           extend=True)
    assert _files(out) == before


def _job(*args):
    return subprocess.run([sys.executable, JOB, *map(str, args)], capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_an_extension_killed_with_sigkill_resumes_bit_identically(tmp_path):
    """resume_job.py's run of 6 outer steps extended to 14: once uninterrupted, once SIGKILLed after step 12 (its
    checkpoint at 10 written) and rerun; both equal a run of 14 steps from the start."""
    straight, once, killed = tmp_path / "straight", tmp_path / "once", tmp_path / "killed"
    for out, args in ((straight, (14,)), (once, (6,)), (once, (14, "--extend")), (killed, (6,))):
        r = _job(out, *args)
        assert r.returncode == 0, r.stderr[-2000:]
    r = _job(killed, 14, 12, "--extend")
    assert r.returncode == -9, (r.returncode, r.stderr[-2000:])  # a real SIGKILL
    assert [line["step"] for line in metrics_lines(killed)] == list(range(1, 13))
    r = _job(killed, 14, "--extend")
    assert r.returncode == 0, r.stderr[-2000:]
    theta = {out: (out / "theta_final.msgpack").read_bytes() for out in (straight, once, killed)}
    assert theta[killed] == theta[once] == theta[straight]
    assert [line["step"] for line in metrics_lines(killed)] == list(range(1, 15))
    assert [(e["from_steps"], e["to_steps"], e["at_step"]) for e in config_history(str(killed))] == [(6, 14, 6)]

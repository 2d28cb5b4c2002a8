"""task_store: a stopped evaluation resumes from the tasks it finished, and never mixes in other settings' runs."""
import json

import jax
import numpy as np
import pytest

import lopt
from outer_trainers.evaluation import BaselineTuning, suite_runs
from outer_trainers.evaluation.task_store import FINISHED_DIR, TaskStore, spec_identity
from tasks import QuadraticFamily, RosenbrockTask


def _theta(path):
    lo = lopt.LearnableSGD(0.1)
    lopt.save_theta(str(path), lo, lo.init(jax.random.key(0)))
    return str(path)


class _StopsOnce:
    """run_task, recording which tasks it trained, that stops (as a lost machine would) on its `stop_at`-th call."""

    def __init__(self, stop_at=None):
        self.real, self.calls, self.stop_at = suite_runs.run_task, [], stop_at

    def __call__(self, family, *args, **kwargs):
        self.calls.append(family)
        if len(self.calls) == self.stop_at:
            raise KeyboardInterrupt("machine lost")
        return self.real(family, *args, **kwargs)


def _evaluate(out, theta, baselines=("adam",), num_steps=8, log=None, **kwargs):
    return suite_runs.evaluate(str(out), optimizers=[theta], tasks=[QuadraticFamily(dim=4), RosenbrockTask()],
                               num_steps=num_steps, num_seeds=2, baselines=list(baselines), time_steps=False,
                               plots=False, tuning=BaselineTuning(max_extensions=0), log=log, **kwargs)


@pytest.mark.slow  # the fast tier keeps the refusal of another record's settings (the store's key)
def test_a_stopped_evaluation_resumes_with_the_tasks_it_finished(tmp_path, monkeypatch):
    theta, out = _theta(tmp_path / "theta.msgpack"), tmp_path / "eval"
    stopped = _StopsOnce(stop_at=2)
    monkeypatch.setattr(suite_runs, "run_task", stopped)
    with pytest.raises(KeyboardInterrupt):
        _evaluate(out, theta)
    assert sorted(p.name for p in (out / FINISHED_DIR).iterdir()) == ["quadratic_dim4.pkl"]
    assert not (out / "results.json").exists()  # an unfinished evaluation writes no results

    resumed = _StopsOnce()
    monkeypatch.setattr(suite_runs, "run_task", resumed)
    res = _evaluate(out, theta)
    assert [f.name for f in resumed.calls] == ["rosenbrock"]  # the finished task is not trained again

    fresh = _evaluate(tmp_path / "fresh", theta)  # the same evaluation, never stopped
    for task in ("quadratic_dim4", "rosenbrock"):
        for a, b in zip(res["results"][task], fresh["results"][task]):
            np.testing.assert_allclose(a["losses"], b["losses"], rtol=1e-6)
            np.testing.assert_allclose(a["evals"], b["evals"], rtol=1e-6)
    doc, again = (json.loads((d / "results.json").read_text()) for d in (out, tmp_path / "fresh"))
    assert doc["summary"]["learned vs adam"]["wins_eval"] == again["summary"]["learned vs adam"]["wins_eval"]


def test_a_record_of_other_settings_is_refused_or_retrained_with_overwrite(tmp_path, monkeypatch):
    theta, out = _theta(tmp_path / "theta.msgpack"), tmp_path / "eval"
    monkeypatch.setattr(suite_runs, "run_task", _StopsOnce(stop_at=2))
    with pytest.raises(KeyboardInterrupt):
        _evaluate(out, theta)
    kept = (out / FINISHED_DIR / "quadratic_dim4.pkl").read_bytes()
    monkeypatch.setattr(suite_runs, "run_task", _StopsOnce())
    with pytest.raises(ValueError, match=r"quadratic_dim4.*other settings \(evaluation.baselines\).*--overwrite"):
        _evaluate(out, theta, baselines=("sgdm",))
    with pytest.raises(ValueError, match=r"other settings \(task.num_steps\)"):
        _evaluate(out, theta, num_steps=6)
    assert (out / FINISHED_DIR / "quadratic_dim4.pkl").read_bytes() == kept  # a refusal changes nothing
    retrained = _StopsOnce()
    monkeypatch.setattr(suite_runs, "run_task", retrained)
    _evaluate(out, theta, baselines=("sgdm",), overwrite=True)
    assert len(retrained.calls) == 2 and (out / FINISHED_DIR / "quadratic_dim4.pkl").read_bytes() != kept

    # A theta file is known by its contents: the same path holding another theta is another optimizer.
    lo = lopt.LearnableSGD(0.5)
    lopt.save_theta(theta, lo, lo.init(jax.random.key(1)))
    for f in suite_runs.RESULT_FILES:  # the results, not the finished tasks, are gone
        (out / f).unlink(missing_ok=True)
    with pytest.raises(ValueError, match=r"other settings \(evaluation.optimizers\)"):
        _evaluate(out, theta, baselines=("sgdm",))


def test_an_unreadable_record_is_named(tmp_path):
    store = TaskStore(str(tmp_path), {"baselines": ["adam"]})
    store.save("quadratic_dim4", {"num_steps": 3}, {"runs": [1, 2]})
    assert store.load("quadratic_dim4", {"num_steps": 3}) == {"runs": [1, 2]}
    assert store.load("rosenbrock", {"num_steps": 3}) is None
    with open(store.path("quadratic_dim4"), "r+b") as f:
        f.truncate(10)
    with pytest.raises(ValueError, match=r"cannot read the finished task record .*quadratic_dim4.pkl.*delete it"):
        store.load("quadratic_dim4", {"num_steps": 3})
    assert spec_identity("pretrained:celo2_v5") == "pretrained:celo2_v5"
    assert store.path("a/b") .endswith("a_b.pkl")


@pytest.mark.slow
def test_baselines_from_reuses_an_earlier_evaluations_tuned_baselines(tmp_path, monkeypatch):
    first, second = _theta(tmp_path / "a.msgpack"), str(tmp_path / "b.msgpack")
    lo = lopt.LearnableSGD(0.03)
    lopt.save_theta(second, lo, lo.init(jax.random.key(1)))
    earlier = _evaluate(tmp_path / "a", first)
    tuned = []
    real = suite_runs.tune_spec
    monkeypatch.setattr(suite_runs, "tune_spec", lambda family, spec, *a, **k: tuned.append(spec) or
                        real(family, spec, *a, **k))
    said = []
    res = _evaluate(tmp_path / "b", second, baselines_from=str(tmp_path / "a"), log=said.append)
    assert tuned == [] and sum("tuned baselines: adam from" in line for line in said) == 2
    for task in ("quadratic_dim4", "rosenbrock"):
        old = [r for r in earlier["results"][task] if r["optimizer"] == "adam"]
        new = [r for r in res["results"][task] if r["optimizer"] == "adam"]
        assert [r["learning_rate"] for r in new] == [r["learning_rate"] for r in old]
        for a, b in zip(new, old):
            np.testing.assert_array_equal(a["evals"], b["evals"])
    ours = [r for r in res["results"]["quadratic_dim4"] if r["optimizer"] == "learned"][0]
    theirs = [r for r in earlier["results"]["quadratic_dim4"] if r["optimizer"] == "learned"][0]
    assert not np.allclose(ours["losses"], theirs["losses"])  # the new theta did run

    # Other settings (here the steps): the baselines are tuned afresh, and the log says why.
    said.clear()
    _evaluate(tmp_path / "c", second, num_steps=6, baselines_from=str(tmp_path / "a"), log=said.append)
    assert tuned == ["adam", "adam"] and sum("other settings (task.num_steps)" in line for line in said) == 2
    # A baseline the earlier evaluation did not tune is tuned here; the others are still reused.
    tuned.clear()
    said.clear()
    _evaluate(tmp_path / "e", second, baselines=("adam", "sgdm"), baselines_from=str(tmp_path / "a"), log=said.append)
    assert tuned == ["sgdm", "sgdm"] and sum("the others tuned here (no runs of sgdm)" in line for line in said) == 2
    with pytest.raises(ValueError, match=r"holds no finished_tasks/.*--baselines_from"):
        _evaluate(tmp_path / "d", second, baselines_from=str(tmp_path / "nowhere"))

"""Published learned optimizers (lopt.published) as untuned baselines of the evaluation protocol."""
import numpy as np
import pytest

import tasks
from outer_trainers.evaluation import optimizer_specs
from outer_trainers.evaluation.suite_runs import run_task
from outer_trainers.evaluation.task_plan import check_arguments
from outer_trainers.evaluation.tuning import baseline_names


def test_published_optimizers_are_untuned_baselines(tmp_path):
    assert optimizer_specs.untuned_baseline_names() == ["published:celo", "published:celo_adam"]
    grids = {"adam": (1e-3,)}
    fam = tasks.QuadraticFamily(dim=4)
    plan = check_arguments(str(tmp_path), ["adam"], None, [fam], 20, 1, ["adam", "published:celo_adam"], grids,
                           0.9, "test")
    assert len(plan) == 1
    with pytest.raises(ValueError, match=r"unknown baselines \['published:velo'\].*published:celo_adam"):
        check_arguments(str(tmp_path), ["adam"], None, [fam], 20, 1, ["published:velo"], grids, 0.9, "test")
    opt = optimizer_specs.resolve_optimizer("published:celo", "published:celo")
    assert opt["kind"] == "published" and opt["name"] == "celo"
    assert optimizer_specs.optimizer_labels(["published:celo", "x.msgpack"]) == ["published:celo", "learned"]


def test_a_published_baseline_runs_once_untuned_and_trains():
    fam = tasks.QuadraticFamily(dim=4)
    runs, seconds = run_task(fam, 30, (0, 1), [], ["published:celo_adam"], {}, "test")
    assert [r["optimizer"] for r in runs] == ["published:celo_adam"] and set(seconds) == {"published:celo_adam"}
    assert "published:celo_adam" not in baseline_names()
    run = runs[0]
    assert np.isnan(run["learning_rate"]) and run["losses"].shape == (2, 30)
    assert np.all(np.isfinite(run["losses"])) and np.all(run["losses"][:, -1] < run["losses"][:, 0])

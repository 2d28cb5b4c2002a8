"""Population-based training with Ray Tune: 2 trials x 4 outer steps; the weaker trial exploits the stronger."""
import json

import numpy as np
import pytest
from ray import tune

from outer_trainers.distributed import pbt_outer_train, pbt_reports
from tests.outer_trainers.distributed.runs import pbt_run

# The slow tier: Ray instances and clusters, on one xdist worker (they share the local Ray instance).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]


def test_pbt_exploits_a_better_trial(ray_local, tmp_path):
    kwargs = dict(param_space={"outer_lr": tune.grid_search([1e-4, 0.3]), "std": 0.05},
                  hyperparam_mutations={"outer_lr": [1e-4, 0.03, 0.3]}, num_trials=1, num_steps=4,
                  perturbation_interval=2, storage_path=str(tmp_path / "tune"), quantile_fraction=0.5,
                  resample_probability=0.0, seed=0)
    results = pbt_outer_train(pbt_run, **kwargs)
    assert results.num_errors == 0 and len(results) == 2
    # lopt's own log of every report (Tune's result.json can lose a restarted trial's reports)
    rows = pbt_reports(results.experiment_path)
    assert {r["step"] for r in rows} == {2, 4} and np.all(np.isfinite([r["meta_loss"] for r in rows]))
    trials = {r["lopt_trial_id"] for r in rows}
    assert len(trials) == 2 and {r["lopt_trial_id"] for r in rows if r["step"] == 2} == trials
    # lineage: a report of a trial that started from another trial's lopt checkpoint (written at step 2)
    exploits = [r for r in rows if r["restored_from"] not in ("", r["lopt_trial_id"])]
    assert exploits, "no trial started from another trial's checkpoint"
    assert {r["restored_from"] for r in exploits} <= trials and {r["step"] for r in exploits} == {4}
    assert {r["config/outer_lr"] for r in exploits} <= {1e-4, 0.03, 0.3}  # explore picked a mutation value
    # Tune's own record of the exploit: [target, clone source, target iteration, source iteration, old, new config]
    decisions = [json.loads(l) for l in open(tmp_path / "tune" / "pbt" / "pbt_global.txt")]
    assert decisions and all(d[0] != d[1] for d in decisions)
    # the experiment directory now holds a run: a second one into it is refused, before Ray is touched
    with pytest.raises(ValueError, match="already holds a PBT run"):
        pbt_outer_train(pbt_run, **kwargs)

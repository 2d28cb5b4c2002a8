"""Population-based training with Ray Tune: 2 trials x 4 outer steps; the weaker trial exploits the stronger."""
import json

import numpy as np
import pandas as pd
from ray import tune

from outer_trainers.distributed import pbt_outer_train
from tests.outer_trainers.distributed.runs import pbt_run


def test_pbt_exploits_a_better_trial(ray_local, tmp_path):
    results = pbt_outer_train(pbt_run, param_space={"outer_lr": tune.grid_search([1e-4, 0.3]), "std": 0.05},
                              hyperparam_mutations={"outer_lr": [1e-4, 0.03, 0.3]}, num_trials=1, num_steps=4,
                              perturbation_interval=2, storage_path=str(tmp_path / "tune"), quantile_fraction=0.5,
                              resample_probability=0.0, seed=0)
    assert results.num_errors == 0 and len(results) == 2
    rows = pd.concat([r.metrics_dataframe for r in results], ignore_index=True)
    assert set(rows["step"]) == {2, 4} and np.all(np.isfinite(rows["meta_loss"]))
    trials = set(rows["lopt_trial_id"])
    assert len(trials) == 2
    # lopt's lineage: a report of a trial that started from another trial's lopt checkpoint (written at step 2)
    src = rows["restored_from"].fillna("")
    exploits = rows[(src != "") & (src != rows["lopt_trial_id"])]
    assert len(exploits), "no trial started from another trial's checkpoint"
    assert set(exploits["restored_from"]) <= trials and set(exploits["step"]) == {4}
    assert set(exploits["config/outer_lr"]) <= {1e-4, 0.03, 0.3}  # explore picked a value from the mutations
    # Tune's own record of the exploit: [target, clone source, target iteration, source iteration, old, new config]
    decisions = [json.loads(l) for l in open(tmp_path / "tune" / "pbt" / "pbt_global.txt")]
    assert decisions and all(d[0] != d[1] for d in decisions)

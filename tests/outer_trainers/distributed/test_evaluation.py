"""The evaluation actor: eval/... metrics in metrics.jsonl, computed with the right theta, and best checkpoints."""
import functools

import jax
import numpy as np
import pytest

import outer_trainers as ot
from outer_trainers.runs.checkpoint_files import read
from outer_trainers.runs.checkpoint_manager import CheckpointManager
from outer_trainers.distributed import EvalActor, RayWorkers, ray_outer_train
from outer_trainers.distributed.learner_state import init_learner_state
from tests.fixtures import metrics_lines
from tests.outer_trainers.distributed.runs import quadratic_evaluator, quadratic_run

# The slow tier: Ray instances and clusters, on one xdist worker (they share the local Ray instance).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]

TIMEOUT = 300
WORKERS = RayWorkers(stall_timeout_s=TIMEOUT)


def test_eval_actor_logs_metrics_and_feeds_best_checkpoints(ray_local, tmp_path):
    make = functools.partial(quadratic_run, num_estimators=1)
    thetas = {0: init_learner_state(make()[0], 1, jax.random.key(0)).theta}
    policy = ot.CheckpointPolicy(every_steps=None, every_seconds=None, save_final=True,
                                 best_metric="eval/final_loss", best_mode="min", keep_best=1)
    state = ray_outer_train(make, 6, num_workers=1, seed=0, progress=False, output_dir=str(tmp_path),
                            evaluation=EvalActor(quadratic_evaluator, every_steps=2), checkpoint_policy=policy,
                            callback=lambda step, st, m: thetas.__setitem__(step, st.theta),
                            workers=WORKERS)
    assert state.step == 6
    lines = metrics_lines(tmp_path)
    assert [l["step"] for l in lines] == list(range(1, 7))
    evals = [l for l in lines if "eval/final_loss" in l]
    assert evals, "no evaluation was logged"
    for l in evals:  # logged after the step it evaluated, with that step's theta
        assert 0 <= l["eval/step"] < l["step"] or l["eval/step"] == l["step"] == 6
    evaluator = quadratic_evaluator()
    for l in evals:
        want = evaluator(thetas[l["eval/step"]])
        np.testing.assert_allclose(l["eval/final_loss"], want["eval/final_loss"], rtol=1e-5)
    best = CheckpointManager(str(tmp_path / "checkpoints")).list("best")
    assert len(best) == 1
    step, path = best[0]
    best_line = min(evals, key=lambda l: l["eval/final_loss"])
    assert step == best_line["eval/step"]
    payload = read(path)
    assert payload["meta"]["best_value"] == best_line["eval/final_loss"]

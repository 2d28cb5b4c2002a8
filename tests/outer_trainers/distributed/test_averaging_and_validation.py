"""Theta averaging and theta_best with Ray workers: a synchronous run equals the local run (theta, its
average, the validated steps, theta_best and its record), and checkpoints the average."""
import functools
import json
import shutil

import jax
import numpy as np
import pytest

import lopt
import outer_trainers as ot
from outer_trainers.distributed import EvalActor, RayWorkers, ray_outer_train
from outer_trainers.runs.checkpoint_manager import CheckpointManager
from outer_trainers.runs.run_checkpoints import theta_from_checkpoint
from tests.fixtures import metrics_lines
from tests.outer_trainers.distributed.runs import quadratic_run, quadratic_validation

# The slow tier: Ray instances and clusters, on one xdist worker (they share the local Ray instance).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]

TIMEOUT = 300
WORKERS = RayWorkers(stall_timeout_s=TIMEOUT)


def _close(a, b):
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(np.asarray(y), np.asarray(x), rtol=1e-5, atol=1e-6)


def test_sync_ray_run_gives_the_local_theta_average_and_theta_best(ray_local, tmp_path):
    make = functools.partial(quadratic_run, num_estimators=2, theta_ema=0.5)
    policy = ot.CheckpointPolicy(every_steps=2, every_seconds=None)
    local_dir, dist_dir = tmp_path / "local", tmp_path / "dist"
    learner, ests = make()
    local = ot.outer_train(learner, ests, 4, seed=3, output_dir=str(local_dir), checkpoint_policy=policy,
                           validation=quadratic_validation(), validation_every=2)
    dist_dir.mkdir()  # the Ray learner reads the tuned baseline from the run's cache and hands it to the actor
    shutil.copy(local_dir / "validation_baseline.json", dist_dir / "validation_baseline.json")
    valid = EvalActor(make_validation=quadratic_validation, validation_every=2)
    dist = ray_outer_train(make, 4, num_workers=2, seed=3, progress=False, output_dir=str(dist_dir),
                           checkpoint_policy=policy, evaluation=valid, workers=WORKERS)
    assert dist.step == 4 and dist.learner_state.theta_avg is not None
    _close(local.theta, dist.theta)
    _close(local.learner_state.theta_avg, dist.learner_state.theta_avg)
    assert abs(float(dist.theta["log_lr"]) - float(dist.final_theta["log_lr"])) > 1e-4  # the average lags theta
    for name in ("theta_final.msgpack", "theta_last.msgpack", "theta_best.msgpack"):
        _close(lopt.load_theta(str(local_dir / name)), lopt.load_theta(str(dist_dir / name)))
    _close(dist.final_theta, lopt.load_theta(str(dist_dir / "theta_final.msgpack")))
    # the same steps validated with the same scores (each logged at its own step here: a checkpoint waits for it)
    scores = lambda d, step_key: {l[step_key]: (l["valid/score"], l["valid/best_score"])
                                  for l in metrics_lines(d) if "valid/score" in l}
    want, got = scores(local_dir, "step"), scores(dist_dir, "valid/step")
    assert sorted(got) == sorted(want) == [2, 4]
    np.testing.assert_allclose([got[s] for s in (2, 4)], [want[s] for s in (2, 4)], rtol=1e-5)
    rec_local, rec_dist = (json.load(open(d / "theta_best.json")) for d in (local_dir, dist_dir))
    assert rec_dist["step"] == rec_local["step"] and rec_dist["theta"].startswith("final_theta")
    np.testing.assert_allclose(rec_dist["score"], rec_local["score"], rtol=1e-5)
    assert rec_dist["cache_key_sha256"] == rec_local["cache_key_sha256"]
    # the checkpoint holds the average, so a resume or --extend continues it
    step, path = max(CheckpointManager(str(dist_dir / "checkpoints")).list("rolling"))
    assert step == 4
    _close(dist.learner_state.theta_avg, theta_from_checkpoint(path, which="result")[1])

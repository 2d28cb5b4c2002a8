"""README's many-machines command and a shipped recipe, run on Ray workers on a loopback 2-node cluster
(`ray.cluster_utils.Cluster`, dashboard off), with fewer steps and smaller tasks through --gin_param.

The command runs as README writes it (`--ray_address auto` finds the cluster through RAY_ADDRESS, as on a
machine of a cluster started with `ray start`) and survives a SIGKILLed worker and a removed node (a
replacement node joins, as an autoscaler adds one); the
recipe (scripts/configs/pretrained_celo2_v5.gin: theta_init, theta_ema, validation) meta-trains on Ray
workers, its theta_init read by the learner alone.
"""
import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
import time

import gin
import lopt
import numpy as np
import psutil
import pytest
import ray
from ray.cluster_utils import Cluster

from tests.fixtures import metrics_lines

# The slow tier: Ray instances and clusters, on one xdist worker (they share the local Ray instance).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
TIMEOUT = 600
# README's "Many machines" command, word for word (the test adds smaller settings after it)
README_COMMAND = ["scripts/outer_train.py", "--gin_file", "scripts/configs/quickstart.gin", "--output_dir", "runs/dist",
                  "--ray_address", "auto", "--gin_param", "train.num_workers = 8"]
SMALLER = ["train.num_steps = 12", "TruncatedPES.num_tasks = 2", "TruncatedPES.trunc_length = 2",
           "LogUniformTruncationSchedule.min_length = 4", "LogUniformTruncationSchedule.max_length = 8",
           "ImageMLPFamily.hidden_sizes = (4,)", "ImageMLPFamily.batch_size = 8",
           'ImageMLPFamily.activations = ("relu",)',
           "Comparison.num_tasks = 0", 'Reporting.progress = "log"']


@pytest.fixture(scope="module")
def cluster():
    """A loopback 2-node cluster: a head node (6 CPUs) and a second node (2 CPUs) that a test may remove."""
    if ray.is_initialized():
        ray.shutdown()  # the shared local instance (`ray_local`) starts again when a later test asks for it
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 6, "include_dashboard": False,
                                                       "node_ip_address": "127.0.0.1"})
    c.second = c.add_node(num_cpus=2, node_ip_address="127.0.0.1")
    c.wait_for_nodes()
    yield c
    if ray.is_initialized():
        ray.shutdown()
    c.shutdown()


def _workers(node) -> list:
    """The EstimatorWorker processes a node's raylet started."""
    raylet = node.all_processes["raylet"][0].process.pid
    return [p for p in psutil.Process(raylet).children(recursive=True)
            if "EstimatorWorker" in " ".join(p.cmdline())]


def _wait_for(ask, what):
    deadline = time.monotonic() + TIMEOUT
    while not ask():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_a_shipped_recipe_meta_trains_on_ray_workers(cluster, tmp_path, monkeypatch):
    """pretrained_celo2_v5.gin (one of its estimators, tiny validation tasks) for 4 steps on one Ray worker: it
    starts from celo2_v4's theta, averages theta and keeps theta_best as a local run does."""
    from outer_trainers.learner import meta_training_run
    spec = importlib.util.spec_from_file_location("outer_train_script", os.path.join(ROOT, "scripts", "outer_train.py"))
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    reads = []
    real = meta_training_run.load_theta_init
    monkeypatch.setattr(meta_training_run, "load_theta_init", lambda *a, **k: reads.append(a[0]) or real(*a, **k))
    out = tmp_path / "celo2"
    try:
        state = script.main([
            "--gin_file", os.path.join(ROOT, "scripts", "configs", "pretrained_celo2_v5.gin"), "--output_dir", str(out),
            "--ray_address", cluster.address, "--gin_param", "train.num_workers = 1",
            "--gin_param", "train.num_steps = 4", "--gin_param", "train.estimators = [@digits/estimator_on_family]",
            "--gin_param", "PowerLawTruncationSchedule.min_length = 4",
            "--gin_param", "PowerLawTruncationSchedule.max_length = 8",
            "--gin_param", "TruncatedPES.num_tasks = 1", "--gin_param", "TruncatedPES.trunc_length = 2",
            "--gin_param", "digits/ImageMLPFamily.hidden_sizes = (4,)", "--gin_param", "ImageMLPFamily.batch_size = 8",
            "--gin_param", "Validation.suite = None", "--gin_param", "Validation.tasks = [@QuadraticFamily()]",
            "--gin_param", "Validation.num_steps = 5", "--gin_param", "Validation.num_seeds = 1",
            "--gin_param", "Validation.every = 2", "--gin_param", "Reporting.progress = 'none'"])
    finally:
        gin.clear_config()
    assert state.step == 4 and reads == ["pretrained:celo2_v4"]  # read once, by the learner
    lines = metrics_lines(out)
    assert lines[-1]["step"] == 4 and lines[-1]["lost_estimates_total"] == 0  # the recipe logs every 50 steps
    assert [l["valid/step"] for l in lines if "valid/step" in l][-1] == 4
    _, start = lopt.pretrained.load_learned_optimizer_by_name("celo2_v4")
    _, final = lopt.load_learned_optimizer(str(out / "theta_final.msgpack"))
    _, last = lopt.load_learned_optimizer(str(out / "theta_last.msgpack"))
    moved = lambda a, b: max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
                             for x, y in zip(jax_leaves(a), jax_leaves(b)))
    assert 0 < moved(final, start) < moved(last, start)  # the average (decay 0.995) trails the last theta
    record = json.loads((out / "theta_best.json").read_text())
    assert record["step"] in (2, 4) and record["theta"].startswith("final_theta")
    assert (out / "validation_baseline.json").exists()


def jax_leaves(tree):
    import jax
    return jax.tree_util.tree_leaves(tree)


def test_readme_many_machines_command_survives_a_killed_worker_and_a_removed_node(cluster, tmp_path):
    os.symlink(os.path.join(ROOT, "scripts"), tmp_path / "scripts")  # run from a directory like the repository's
    env = dict(os.environ, RAY_ADDRESS=cluster.address)
    log = open(tmp_path / "log.txt", "w")
    args = [a for p in SMALLER for a in ("--gin_param", p)]
    proc = subprocess.Popen([sys.executable, *README_COMMAND, *args], cwd=tmp_path, env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    out = tmp_path / "runs" / "dist"
    try:
        _wait_for(lambda: proc.poll() is not None or (out / "metrics.jsonl").exists() and
                  len((out / "metrics.jsonl").read_text().splitlines()) >= 2, "2 steps")
        assert proc.poll() is None, (tmp_path / "log.txt").read_text()[-3000:]
        os.kill(proc.pid, signal.SIGSTOP)  # hold the learner while the faults happen, mid-run
        try:
            head, second = _workers(cluster.head_node), _workers(cluster.second)
            assert len(head) + len(second) == 8 and second, "no worker runs on the node to be removed"
            os.kill(head[0].pid, signal.SIGKILL)
            cluster.remove_node(cluster.second)
            # a replacement node (as an autoscaler adds one): in synchronous mode every step waits for every
            # worker's estimators, and the head's 6 CPUs cannot hold the 2 restarted workers besides its own 6
            cluster.second = cluster.add_node(num_cpus=2, node_ip_address="127.0.0.1")
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        assert proc.wait(timeout=TIMEOUT) == 0, (tmp_path / "log.txt").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    lines = metrics_lines(out)
    assert [l["step"] for l in lines] == list(range(1, 13))
    last = lines[-1]
    assert last["worker_restarts_total"] >= 1 + len(second) and last["lost_estimates_total"] >= 1
    assert 1 <= last["workers_ready"] <= 8 and math.isfinite(last["meta_loss"])
    _, final = lopt.load_learned_optimizer(str(out / "theta_final.msgpack"))
    _, last_theta = lopt.load_learned_optimizer(str(out / "theta_last.msgpack"))  # train.theta_ema = 0.99
    assert all(np.isfinite(np.asarray(x)).all() for x in jax_leaves(final) + jax_leaves(last_theta))
    assert "train.theta_ema = 0.99" in (out / "config.gin").read_text()

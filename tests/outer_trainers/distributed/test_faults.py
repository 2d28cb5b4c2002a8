"""Faults: a worker process killed with SIGKILL, a node removed from a 2-node cluster."""
import functools
import os
import signal
import time

import numpy as np
import pytest
import ray
from ray.cluster_utils import Cluster
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from outer_trainers.distributed import RayWorkers, ray_outer_train
from tests.fixtures import metrics_lines
from tests.outer_trainers.distributed.runs import quadratic_run

# The slow tier: Ray instances and clusters, on one xdist worker (they share the local Ray instance).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]

TIMEOUT = 300
WORKERS = RayWorkers(stall_timeout_s=TIMEOUT)


def _when(ask):
    """ask()'s first truthy answer, asking again while Ray reports the actor restarting (bounded by TIMEOUT)."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        try:
            answer = ask()
        except ray.exceptions.ActorUnavailableError:
            answer = None
        if answer or time.monotonic() > deadline:
            return answer
        time.sleep(0.2)


def test_sigkill_a_worker_mid_run(ray_local, tmp_path):
    make = functools.partial(quadratic_run, num_estimators=2)
    killed = []

    def kill_worker_1(step, state, metrics):
        if step == 2:
            victim = ray.get_actor("lopt-test-victim")
            pid = ray.get(victim.pid.remote(), timeout=TIMEOUT)
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        if step == 3:  # wait until Ray restarted it and the learner's reset ran there, so it rejoins in time
            victim = ray.get_actor("lopt-test-victim")
            killed.append(_when(lambda: ray.get(victim.pid.remote(), timeout=TIMEOUT)))
            _when(lambda: ray.get(victim.num_states.remote(), timeout=TIMEOUT))

    state = ray_outer_train(make, 7, num_workers=2, seed=0, progress=False, output_dir=str(tmp_path),
                            callback=kill_worker_1,
                            workers=RayWorkers(stall_timeout_s=TIMEOUT,
                                               actor_options=[None, {"name": "lopt-test-victim"}]))
    assert len(killed) == 2 and killed[0] != killed[1] and state.step == 7
    assert all(np.isfinite(np.asarray(v)).all() for v in state.theta.values())
    lines = metrics_lines(tmp_path)
    assert [l["step"] for l in lines] == list(range(1, 8))
    last = lines[-1]
    assert last["worker_restarts_total"] == 1 and last["lost_estimates_total"] == 1
    assert all(l["lost_estimates_total"] == 0 for l in lines[:2])
    # the step after the kill applied only worker 0's estimate; once restarted, worker 1 contributes again
    assert "meta_loss/TruncatedPES/quadratic_dim4_1" not in lines[2]
    assert "meta_loss/TruncatedPES/quadratic_dim4_1" in last and last["workers_ready"] == 2


@pytest.mark.slow
def test_remove_a_node_mid_run(tmp_path):
    """A worker pinned (softly) to the second node of a 2-node Cluster; the node is removed after step 2."""
    if ray.is_initialized():
        ray.shutdown()  # this test needs its own multi-node cluster; `ray_local` restarts the shared one
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False,
                                                            "node_ip_address": "127.0.0.1"})
    try:
        doomed = cluster.add_node(num_cpus=1, resources={"doomed": 1}, node_ip_address="127.0.0.1")
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
        cluster.wait_for_nodes()
        on_doomed = {"scheduling_strategy": NodeAffinitySchedulingStrategy(doomed.node_id, soft=True)}
        make = functools.partial(quadratic_run, num_estimators=2)
        placed = {}

        def remove_at_2(step, state, metrics):
            if step == 1:
                placed["node"] = ray.get(ray.get_actor("lopt-test-doomed").node_id.remote(), timeout=TIMEOUT)
            if step == 2:
                cluster.remove_node(doomed)
            if step == 3:  # wait until it runs again (on the head node) with fresh particles
                actor = ray.get_actor("lopt-test-doomed")
                _when(lambda: ray.get(actor.num_states.remote(), timeout=TIMEOUT))
                placed["after"] = ray.get(actor.node_id.remote(), timeout=TIMEOUT)

        state = ray_outer_train(make, 6, num_workers=2, seed=0, progress=False, output_dir=str(tmp_path),
                                callback=remove_at_2,
                                workers=RayWorkers(stall_timeout_s=TIMEOUT,
                                                   actor_options=[None, dict(on_doomed, name="lopt-test-doomed")]))
        assert placed["node"] == doomed.node_id  # the worker did run on the node that was removed
        assert state.step == 6
        last = metrics_lines(tmp_path)[-1]
        assert last["worker_restarts_total"] >= 1 and last["lost_estimates_total"] >= 1
        assert placed["after"] != doomed.node_id and last["workers_ready"] == 2  # restarted on the head node
        assert "meta_loss/TruncatedPES/quadratic_dim4_1" in last
    finally:
        ray.shutdown()
        cluster.shutdown()

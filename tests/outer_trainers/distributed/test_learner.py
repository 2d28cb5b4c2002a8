"""ray_outer_train: synchronous mode equals outer_train; asynchronous mode; resume; no recompiles."""
import functools
import os
import time
import types

import jax
import numpy as np
import pytest
import ray

import outer_trainers as ot
from outer_trainers.distributed import EvalActor, RayWorkers, ray_outer_train
from outer_trainers.distributed import learner as dist_learner
from outer_trainers.distributed.learner_loop import LearnerLoop
from outer_trainers.distributed.learner_state import init_learner_state
from outer_trainers.distributed.worker import EstimatorWorker
from outer_trainers.distributed.worker_pool import Event
from outer_trainers.runs.reporting import Reporter
from outer_trainers.runs.run_checkpoints import RunCheckpoints
from tests.fixtures import metrics_lines
from tests.outer_trainers.distributed.runs import fails_on_workers, quadratic_run

TIMEOUT = 300  # generous: other engineers' tests share the 2 cores
WORKERS = RayWorkers(stall_timeout_s=TIMEOUT)
# The fast tier has one Ray run (sync mode equals the local loop, the distributed modules' core promise);
# the other Ray runs are the slow tier. All share one xdist worker (one local Ray instance).
RAY = pytest.mark.xdist_group("ray")


def _theta(state):
    return {k: float(v) for k, v in jax.device_get(state.theta).items()}


@RAY
def test_sync_mode_equals_local_outer_train(ray_local, tmp_path):
    make = functools.partial(quadratic_run, num_estimators=3)
    learner, ests = make()
    local_losses = []
    local = ot.outer_train(learner, ests, num_steps=4, seed=3, reporting=ot.Reporting(progress=False),
                           weights=[1.0, 2.0, 1.0],
                           callback=lambda s, st, m: local_losses.append(m["meta_loss"]))
    compiles = {}

    def count_compiles(step, state, metrics):  # XLA compilations in each worker after steps 2 and 4
        compiles[step] = [ray.get(ray.get_actor(f"lopt-test-w{w}").compiles.remote(), timeout=TIMEOUT)
                          for w in range(2)]

    dist = ray_outer_train(make, 4, num_workers=2, seed=3, progress=False, weights=[1.0, 2.0, 1.0],
                           output_dir=str(tmp_path), callback=count_compiles,
                           workers=RayWorkers(stall_timeout_s=TIMEOUT,
                                              actor_options=[{"name": "lopt-test-w0"}, {"name": "lopt-test-w1"}]))
    init = _theta(ot.init_outer_state(learner, ests, jax.random.key(3)))
    a, b = _theta(local), _theta(dist)
    assert dist.step == 4
    for k in a:
        np.testing.assert_allclose(b[k], a[k], rtol=1e-5, atol=1e-6)
    assert max(abs(a[k] - init[k]) for k in a) > 1e-3  # theta moved, so the comparison means something
    lines = metrics_lines(tmp_path)
    assert [l["step"] for l in lines] == [1, 2, 3, 4]
    np.testing.assert_allclose([l["meta_loss"] for l in lines], local_losses, rtol=1e-5)
    assert all(l["staleness/max"] == 0 and l["lost_estimates_total"] == 0 for l in lines)
    assert (tmp_path / "theta_final.msgpack").exists()
    # each worker compiled on its first reset and estimate, and never again
    assert all(c > 0 for c in compiles[2]) and compiles[4] == compiles[2]


@pytest.mark.slow
@RAY
def test_async_two_workers_reports_staleness(ray_local, tmp_path):
    make = functools.partial(quadratic_run, num_estimators=2)
    state = ray_outer_train(make, 6, num_workers=2, seed=0, progress=False, output_dir=str(tmp_path),
                            workers=RayWorkers(max_staleness=2, num_estimates_per_step=1, stall_timeout_s=TIMEOUT))
    assert state.step == 6
    assert all(np.isfinite(v) for v in _theta(state).values())
    lines = metrics_lines(tmp_path)
    assert [l["step"] for l in lines] == list(range(1, 7))
    last = lines[-1]
    counts = [last[f"staleness/count_{s}"] for s in range(3)]
    assert sum(counts) == 6  # one estimate applied per update, each counted once by its staleness
    assert last["stale_dropped_total"] == last["staleness/count_gt2"]
    assert all(0 <= l["staleness/max"] <= 2 and l["staleness/mean"] <= l["staleness/max"] for l in lines)
    assert last["lost_estimates_total"] == 0 and last["worker_restarts_total"] == 0


class _ScriptedPool:
    """A WorkerPool double: EstimatorWorkers in this process; worker `slow`'s results are held back until
    the other worker has returned `hold` estimates, so staleness is deterministic."""

    def __init__(self, make, assignment, slow, hold):
        self.workers = [EstimatorWorker(make, a) for a in assignment]
        self.assignment = [tuple(a) for a in assignment]
        n = len(assignment)
        self.ready, self.busy, self.recovering = [False] * n, [False] * n, [False] * n
        self.restarts = self.lost_estimates = 0
        self.slow, self.hold, self.fast_done, self.queue = slow, hold, 0, []

    def __len__(self):
        return len(self.workers)

    def reset(self, w, theta, keys, it):
        self.busy[w] = True
        self.queue.append(Event("reset", w, self.workers[w].reset(theta, keys, it)))

    def estimate(self, w, theta, version, keys, it):
        self.busy[w] = True
        self.queue.append(Event("estimate", w, self.workers[w].estimate(theta, version, keys, it)))

    def idle_ready(self):
        return [w for w in range(len(self)) if self.ready[w] and not self.busy[w]]

    def starting(self):
        return [w for w in range(len(self)) if not self.ready[w] and not self.recovering[w]]

    def in_flight(self):
        return len(self.queue)

    def due_resets(self):
        return []

    def next_reset_in(self):
        return None

    def wait(self, timeout_s, num_returns=1):
        held = lambda e: e.kind == "estimate" and e.worker == self.slow and self.fast_done < self.hold
        e = next(e for e in self.queue if not held(e))
        self.queue.remove(e)
        self.busy[e.worker] = False
        if e.kind == "reset":
            self.ready[e.worker] = True
        elif e.worker != self.slow:
            self.fast_done += 1
        return [e]


def test_async_staleness_is_measured_and_bounded():
    """Worker 1's first estimate (at theta version 0) arrives after 3 updates: with max_staleness=1 it is
    dropped and counted; its next one (dispatched at version 3) is applied 0-1 versions old."""
    make = functools.partial(quadratic_run, num_estimators=2)
    learner, ests = make()
    state = init_learner_state(learner, 2, jax.random.key(0))
    pool = _ScriptedPool(make, [(0,), (1,)], slow=1, hold=3)
    fake_ray = types.SimpleNamespace(put=lambda x: x)
    loop = LearnerLoop(learner, ests, [1.0, 1.0], state, 0, pool, None, RunCheckpoints(None), 1, 1, False, 10.0,
                       fake_ray)
    logged = []
    with Reporter(None, start=0, target=6, progress=False) as reporter:
        final = loop.run(6, reporter, lambda step, st, m: logged.append(m))
    assert final.step == 6 and int(final.learner_state.step) == 6
    last = logged[-1]
    assert last["stale_dropped_total"] == 1 and last["staleness/count_gt1"] == 1
    assert last["staleness/count_0"] + last["staleness/count_1"] == 6
    assert [m["staleness/max"] for m in logged[:3]] == [0, 0, 0]  # worker 0 alone: always the newest theta
    assert all(np.isfinite(v) for v in _theta(final).values())


@pytest.mark.slow
@RAY
def test_resume_after_a_killed_learner(ray_local, tmp_path):
    """The learner dies after step 3 (an exception in its callback); rerunning resumes from its checkpoint."""
    make = functools.partial(quadratic_run, num_estimators=1)
    policy = ot.CheckpointPolicy(every_steps=1, every_seconds=None)
    seen = {}

    def die_at_3(step, state, metrics):
        seen[step] = _theta(state)
        if step == 3:
            raise KeyboardInterrupt("learner killed")

    with pytest.raises(KeyboardInterrupt):
        ray_outer_train(make, 6, num_workers=1, seed=1, progress=False, output_dir=str(tmp_path),
                        checkpoint_policy=policy, callback=die_at_3, workers=WORKERS)
    steps = []
    state = ray_outer_train(make, 5, num_workers=1, seed=1, progress=False, output_dir=str(tmp_path),
                            checkpoint_policy=policy, workers=WORKERS,
                            callback=lambda step, st, m: steps.append(step))
    assert steps == [4, 5] and state.step == 5
    assert int(state.learner_state.step) == 5  # updates applied: 3 before the kill + 2 after
    adam_count = [x for x in jax.tree_util.tree_leaves(state.learner_state.opt_state) if np.ndim(x) == 0
                  and np.issubdtype(np.asarray(x).dtype, np.integer)]
    assert adam_count and int(adam_count[0]) == 5  # the outer optimizer's state was restored, not re-initialised
    lines = metrics_lines(tmp_path)
    assert [l["step"] for l in lines] == [1, 2, 3, 4, 5]
    from outer_trainers.runs.checkpoint_manager import CheckpointManager
    assert max(s for s, _ in CheckpointManager(str(tmp_path / "checkpoints")).list("rolling")) == 5
    # a changed run is refused, and nothing on disk changes
    with pytest.raises(ValueError):
        ray_outer_train(functools.partial(quadratic_run, num_estimators=3), 6, num_workers=2, progress=False,
                        output_dir=str(tmp_path), checkpoint_policy=policy, workers=WORKERS)
    assert [line["step"] for line in metrics_lines(tmp_path)] == [1, 2, 3, 4, 5]


@pytest.mark.slow
@RAY
def test_a_worker_that_cannot_build_the_run_fails_clearly(ray_local, tmp_path):
    make = functools.partial(fails_on_workers, os.getpid())
    with pytest.raises(RuntimeError, match="(?s)could not be built.*cannot be built here"):
        ray_outer_train(make, 2, num_workers=1, progress=False, output_dir=str(tmp_path), workers=WORKERS)
    assert not (tmp_path / "metrics.jsonl").exists() or not (tmp_path / "metrics.jsonl").read_text()


def test_ray_workers_meta_train_repeats_the_weights_per_copy(monkeypatch):
    """`RayWorkers.meta_train` (the gin-configured run's Ray path) is `ray_outer_train` with its settings."""
    seen = {}
    monkeypatch.setattr(dist_learner, "ray_outer_train", lambda *args, **kwargs: seen.update(args=args, kwargs=kwargs))
    workers = RayWorkers(max_staleness=1)
    workers.meta_train("make_run", 4, num_workers=3, copies=2, weights=[1.0, 3.0], make_evaluator=print,
                       eval_every=5, make_validation=dict, validation_every=2, seed=7)
    assert seen["args"] == ("make_run", 4)
    assert seen["kwargs"] == dict(num_workers=3, workers=workers, weights=[1.0, 3.0, 1.0, 3.0], seed=7,
                                  evaluation=EvalActor(print, every_steps=5, make_validation=dict, validation_every=2))


def test_ray_workers_settings_are_checked_values():
    assert RayWorkers().synchronous and not RayWorkers(max_staleness=1).synchronous
    assert RayWorkers(actor_options=[{"a": 1}]) == RayWorkers(actor_options=({"a": 1},))
    assert hash(RayWorkers(actor_options=[{"a": 1}])) == hash(RayWorkers())  # actor options are left out of it
    with pytest.raises(ValueError, match="max_staleness"):
        RayWorkers(max_staleness=-1)
    with pytest.raises(ValueError, match="num_estimates_per_step"):
        RayWorkers(num_estimates_per_step=0)
    with pytest.raises(TypeError, match="workers must be a RayWorkers"):
        ray_outer_train(lambda: None, 2, num_workers=1, workers={"max_staleness": 1})


class _SilentPool:
    """A WorkerPool double whose calls never answer; worker 1 is restarting when `restarting`."""

    def __init__(self, restarting):
        self.ready, self.busy, self.recovering = [True, not restarting], [True, False], [False, restarting]
        self.waits = []

    def __len__(self):
        return 2

    def due_resets(self):
        return []

    def next_reset_in(self):
        return None

    def in_flight(self):
        return 1

    def wait(self, timeout_s, num_returns=1):
        self.waits.append(timeout_s)
        return []


@pytest.mark.parametrize("restarting", [True, False])
def test_a_run_waiting_on_restarting_workers_says_so_once_then_stops(restarting, caplog):
    """Silence while a worker restarts is warned about once, naming it, after stall_warning_s; silence while
    every worker computes (e.g. a long first compile) is not; silence past stall_timeout_s stops the run."""
    from outer_trainers.distributed import learner_loop
    loop = object.__new__(LearnerLoop)
    loop.pool, loop.stall_timeout_s, loop.version, loop._stall_warned = _SilentPool(restarting), 100.0, 7, False
    assert learner_loop.stall_warning_s(100.0) == 10.0 and learner_loop.stall_warning_s(3600.0) == 60.0
    loop._last_answer = time.monotonic() - 4.0
    with caplog.at_level("WARNING", logger="outer_trainers"):
        loop._wait()
        assert not caplog.records  # 4 s < 10 s: no warning yet
        if restarting:  # it wakes up in time to warn
            assert loop.pool.waits[-1] <= 6.0 + 1e-6
        loop._last_answer = time.monotonic() - 11.0
        loop._wait()
        loop._wait()
    warnings = [r.getMessage() for r in caplog.records]
    if restarting:
        assert len(warnings) == 1 and "workers [1] restart" in warnings[0] and "step 7" in warnings[0]
    else:
        assert warnings == [] and loop.pool.waits == [100.0] * 3
    loop._last_answer = time.monotonic() - 101.0
    with pytest.raises(RuntimeError, match="no worker answered for 100 s"):
        loop._wait()

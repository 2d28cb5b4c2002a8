"""ray_outer_train: meta-training with one learner (this process) and Ray worker actors.

    state = ray_outer_train(make_run, num_steps=1000, num_workers=8, output_dir="runs/dist")

`make_run() -> (GradientLearner, [GradientEstimator, ...])` is the run's description; it must be
picklable (a module-level function or `functools.partial` of one, or scripts/outer_train.py's
gin-config factory): each worker calls it to build its own estimators. The learner (the calling
process) owns theta, the outer optimizer state, the step, checkpoints and summaries, and applies
updates with `GradientLearner.update`, reporting with `Reporter` and saving with `RunCheckpoints`
exactly as `outer_train` does (same files, resume and extension rules, progress display, divergence
stop). Worker w owns the estimators i with i % num_workers == w (`assign_estimators`).

Synchronous mode (`max_staleness=0`, `num_estimates_per_step=None`): every outer step sends the
current theta and, per estimator, the key `outer_train` would give it (the step's
`split(state.key, K + 1)`), waits for all workers and applies one update from the K estimates in
estimator order — with the same seed the same theta as `outer_train` over the same estimators, to
float32 tolerance (only the process that runs each XLA program differs).

Asynchronous mode (otherwise): workers never wait for each other; a worker that returns is at
once given the newest theta. The learner applies an update as soon as it holds
`num_estimates_per_step` estimates whose theta version is at most `max_staleness` updates old;
staler ones are dropped and counted. Per step it logs "staleness/mean" and "staleness/max" of the
applied estimates and, cumulative over the session, "staleness/count_<s>" (estimates applied s
versions old, and "staleness/count_gt<max_staleness>" those dropped as staler), "stale_dropped_total",
"lost_estimates_total" and "worker_restarts_total". In synchronous mode it also logs
"timing/round_s" (the step's wall time from sending theta to holding every estimate) and
"timing/worker_s" (the slowest worker's time inside its estimate calls): their difference is the
distributed path's overhead (transfers, scheduling).

Faults: a worker whose process or node dies loses its in-flight estimate; Ray restarts the actor
(elsewhere if its node is gone) and the learner re-initialises its particles at the current
theta, while the other workers go on (in synchronous mode, steps meanwhile use the estimates
that arrived). Re-initialised PES particles restart their perturbation sums and inner
episodes: their first estimates are those of fresh particles (unbiased, but with the short-
horizon weighting of new episodes until they have run a while). The learner checkpoints
theta, the outer optimizer state, the key and the step (not the particles): a killed learner rerun
with the same `output_dir` resumes there and the workers start fresh particles. No `theta_ema` here.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np

from lopt.serialization import save_theta
from outer_trainers.runs.checkpoint_policy import CheckpointPolicy
from outer_trainers.distributed.cluster import connect_ray, import_ray, worker_runtime_env
from outer_trainers.distributed.eval_worker import EvalClient
from outer_trainers.distributed.learner_state import init_learner_state, particle_keys
from outer_trainers.distributed.worker import key_data
from outer_trainers.distributed.worker_pool import WorkerPool, assign_estimators
from outer_trainers.validation import check_int, check_optional_int, check_weights
from outer_trainers.learner.outer_train import OuterTrainState
from outer_trainers.runs.reporting import DEFAULT_MAX_CONSECUTIVE_DROPPED, Reporter
from outer_trainers.learner.run_records import estimator_labels, run_metadata
from outer_trainers.runs.run_checkpoints import THETA_FINAL, RunCheckpoints

logger = logging.getLogger("outer_trainers")
DEFAULT_STALL_TIMEOUT_S = 900.0


def _numpy(tree: Any) -> Any:
    return jax.tree_util.tree_map(np.asarray, jax.device_get(tree))


def _unique_labels(labels: Sequence[str]) -> list[str]:
    seen: dict = {}
    out = []
    for lab in labels:
        seen[lab] = seen.get(lab, 0) + 1
        out.append(lab if seen[lab] == 1 else f"{lab}#{seen[lab]}")
    return out


class _Stats:
    """Per-session counts of the distributed path, added to each step's metrics."""

    def __init__(self, max_staleness: int):
        self.counts = np.zeros(max_staleness + 2, np.int64)  # last bucket: staler than max_staleness
        self.stale_dropped = 0

    def applied(self, staleness: Sequence[int]) -> None:
        for s in staleness:
            self.counts[min(s, len(self.counts) - 1)] += 1

    def dropped(self, staleness: int) -> None:
        self.counts[min(staleness, len(self.counts) - 1)] += 1
        self.stale_dropped += 1

    def metrics(self, applied: Sequence[int], pool: WorkerPool) -> dict:
        out = {f"staleness/count_{s}": int(c) for s, c in enumerate(self.counts[:-1])}
        out[f"staleness/count_gt{len(self.counts) - 2}"] = int(self.counts[-1])
        out["staleness/mean"] = float(np.mean(applied)) if len(applied) else 0.0
        out["staleness/max"] = int(max(applied)) if len(applied) else 0
        out["stale_dropped_total"] = self.stale_dropped
        out["lost_estimates_total"] = pool.lost_estimates
        out["worker_restarts_total"] = pool.restarts
        out["workers_ready"] = int(sum(pool.ready))
        return out


def ray_outer_train(make_run: Callable[[], tuple], num_steps: int, *, num_workers: int = 2,
                    max_staleness: int = 0, num_estimates_per_step: Optional[int] = None,
                    output_dir: Optional[str] = None, seed: int = 0, weights: Optional[Sequence[float]] = None,
                    progress: Union[bool, str] = True, log_every: int = 1,
                    callback: Optional[Callable[[int, OuterTrainState, dict], None]] = None,
                    checkpoint_policy: Optional[CheckpointPolicy] = None, resume: bool = True,
                    overwrite: bool = False, make_evaluator: Optional[Callable[[], Callable]] = None,
                    eval_every_steps: int = 0, eval_every_seconds: Optional[float] = None,
                    tensorboard: bool = True, config: Optional[dict] = None,
                    max_consecutive_dropped: Optional[int] = DEFAULT_MAX_CONSECUTIVE_DROPPED,
                    ray_address: Optional[str] = None, num_cpus: Optional[int] = None,
                    worker_threads: Optional[int] = 1, actor_options: Optional[Sequence[Optional[dict]]] = None,
                    max_restarts: int = -1,
                    stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S, extend: bool = False) -> OuterTrainState:
    """Meta-trains theta with Ray worker actors and returns the learner's final state (see the module docstring).

    Args:
        make_run: picklable `make_run() -> (GradientLearner, [GradientEstimator, ...])`, called here and on every worker.
        num_steps: outer steps in total (a resumed run trains up to it; see `outer_train` on extending).
        num_workers: N worker actors (1 <= N <= the number of estimators).
        max_staleness: the most updates an estimate's theta may lag behind the current theta to be applied.
        num_estimates_per_step: estimates per update in asynchronous mode (default: the number of estimators);
            None with `max_staleness=0` is synchronous mode.
        output_dir: where metrics.jsonl, tb/, checkpoints/ and theta_final.msgpack go (None: nowhere).
        seed: the run's seed (for a new run).
        weights: one weight per estimator for the learner's average (default: equal).
        progress: True or "bar" (tqdm), "log" (plain lines), False or "none".
        log_every: log metrics every this many steps (and at the last step).
        callback: `callback(step, state, metrics)` after each logged step (as in `outer_train`).
        checkpoint_policy: when to checkpoint (default `CheckpointPolicy()`); needs `output_dir`.
        resume: continue from `output_dir`'s newest readable checkpoint (see `outer_train`).
        overwrite: start a new run over `output_dir`'s results, deleting them first (see `outer_train`).
        make_evaluator: picklable `make_evaluator() -> evaluator` (e.g. of a MetaEvaluator) run in an
            evaluation actor; its metrics are logged with the step after they arrive and feed "best"
            checkpoints (`checkpoint_policy.best_metric`) of the evaluated step's state.
        eval_every_steps: evaluate every this many steps (0: not by steps).
        eval_every_seconds: evaluate every this many seconds (None: not by time).
        tensorboard: also write TensorBoard event files.
        config: JSON-able run configuration stored in checkpoints; it must match on resume.
        max_consecutive_dropped: stop with MetaTrainingDiverged after this many steps in a row that applied
            nothing (see `outer_train`); None: never.
        ray_address: the Ray cluster to use (see `connect_ray`); None: this process's Ray if it is already
            initialised, else a local instance started here (and shut down at the end).
        num_cpus: CPUs of a local Ray instance started here (None: all).
        worker_threads: XLA/OpenMP threads per actor (None: the libraries' defaults); see `worker_runtime_env`.
        actor_options: per worker, extra Ray actor options (e.g. `resources` or a `scheduling_strategy`).
        max_restarts: how often Ray may restart each worker actor (-1: without limit).
        stall_timeout_s: give up (RuntimeError) when no worker answers for this long.
        extend: train the run in `output_dir` further, to another `num_steps` (as `outer_train`'s `extend`).

    Returns:
        The learner's OuterTrainState after the last step (`estimator_states=()`: the particles live on the
        workers).

    Raises:
        ValueError, TypeError: a bad argument (before Ray starts or anything is written).
        ConnectionError: `ray_address` cannot be reached (a `distributed.RayConnectionError`).
        MetaTrainingDiverged: as in `outer_train`.
        RuntimeError: no worker answered for `stall_timeout_s`.
    """
    check_int("num_steps", num_steps, minimum=0)
    check_int("num_workers", num_workers, minimum=1)
    check_int("max_staleness", max_staleness, minimum=0)
    check_optional_int("num_estimates_per_step", num_estimates_per_step, minimum=1)
    check_int("log_every", log_every, minimum=1)
    check_optional_int("max_consecutive_dropped", max_consecutive_dropped, minimum=1)
    learner, estimators = make_run()
    if getattr(learner, "theta_ema", None) is not None:  # the learner's moving average of theta: not here
        raise ValueError(f"ray_outer_train cannot average theta (theta_ema={learner.theta_ema}); use outer_train")
    estimators = list(estimators)
    if not estimators:
        raise ValueError("ray_outer_train needs at least one GradientEstimator (make_run returned none)")
    K = len(estimators)
    weights = check_weights(weights, K)  # [1.0] * K for None
    assignment = assign_estimators(K, num_workers)
    synchronous = max_staleness == 0 and num_estimates_per_step is None
    per_step = K if num_estimates_per_step is None else num_estimates_per_step
    policy = checkpoint_policy or CheckpointPolicy()
    if make_evaluator is None and policy.best_metric and (eval_every_steps or eval_every_seconds):
        raise ValueError("eval_every_steps / eval_every_seconds need make_evaluator")

    run = RunCheckpoints(output_dir, policy, dict(run_metadata(learner, estimators, config), num_steps=num_steps),
                         fixed_length=False)
    run.check_start(resume=resume, overwrite=overwrite, extend=extend)  # refuse before Ray starts or a write
    started = connect_ray(ray_address, num_cpus=num_cpus)
    ray = import_ray()
    pool = evals = None
    try:
        state, totals = run.restore_or_init(lambda k: init_learner_state(learner, K, k), jax.random.key(seed),
                                            resume=resume, overwrite=overwrite, extend=extend)
        env = worker_runtime_env(worker_threads)
        pool = WorkerPool(make_run, assignment, actor_options=actor_options, runtime_env=env,
                          max_restarts=max_restarts)
        if make_evaluator is not None and (eval_every_steps or eval_every_seconds):
            evals = EvalClient(make_evaluator, every_steps=eval_every_steps, every_seconds=eval_every_seconds,
                               runtime_env=env)
        loop = _Loop(learner, estimators, weights, state, seed, pool, evals, run, max_staleness, per_step,
                     synchronous, stall_timeout_s, ray)
        target = num_steps
        with Reporter(output_dir, start=state.step, target=target, progress=progress, log_every=log_every,
                      tensorboard=tensorboard, totals=totals,
                      max_consecutive_dropped=max_consecutive_dropped) as reporter:
            state = loop.run(target, reporter, callback)
        if output_dir is not None:
            save_theta(os.path.join(output_dir, THETA_FINAL), learner.learned_opt, state.theta)
        return state
    finally:
        if pool is not None:
            pool.shutdown()
        if evals is not None:
            evals.shutdown()
        if started:
            ray.shutdown()


class _Loop:
    """The learner's loop over outer steps (synchronous or asynchronous), over a WorkerPool."""

    def __init__(self, learner, estimators, weights, state, seed, pool, evals, run, max_staleness, per_step,
                 synchronous, stall_timeout_s, ray):
        self.learner, self.estimators, self.weights = learner, estimators, weights
        self.labels = estimator_labels(estimators)
        self.state, self.seed, self.pool, self.evals, self.ckpt = state, seed, pool, evals, run
        self.max_staleness, self.per_step, self.synchronous = max_staleness, per_step, synchronous
        self.stall_timeout_s, self.ray = stall_timeout_s, ray
        self.stats = _Stats(max_staleness)
        self.K = len(estimators)
        self.version = int(state.step)
        self.theta_ref = ray.put(_numpy(state.theta))
        self.resets = 0
        self.dispatches = 0
        self.eval_pending: dict = {}
        self._last_answer = time.monotonic()
        self.timing: dict = {}
        keys = particle_keys(seed, state, self.K)
        for w, indices in enumerate(pool.assignment):
            pool.reset(w, self.theta_ref, key_data(keys, indices), self.version)

    # ---- worker events -------------------------------------------------------------------------------------
    def _reset_worker(self, w: int) -> None:
        self.resets += 1
        keys = particle_keys(self.seed, self.state, self.K, salt=1000 + self.resets)
        self.pool.reset(w, self.theta_ref, key_data(keys, self.pool.assignment[w]), self.version)

    def _wait(self, num_returns: int = 1) -> list:
        for w in self.pool.due_resets():
            self._reset_worker(w)
        timeout = self.stall_timeout_s
        retry_in = self.pool.next_reset_in()
        if retry_in is not None:  # come back in time to resend a reset to a worker Ray is restarting
            if not self.pool.in_flight():
                time.sleep(retry_in)
                return []
            timeout = min(timeout, retry_in)
        events = self.pool.wait(timeout, num_returns=num_returns)
        now = time.monotonic()
        if any(e.kind != "failed" for e in events):
            self._last_answer = now
        elif now - self._last_answer > self.stall_timeout_s:
            raise RuntimeError(f"no worker answered for {self.stall_timeout_s:g} s ({self.pool.in_flight()} calls in "
                               f"flight, {sum(self.pool.ready)} of {len(self.pool)} workers ready): the cluster may "
                               f"lack the resources to (re)start them")
        for e in events:
            if e.kind == "failed" and e.payload == "estimate":
                logger.warning("worker %d failed (%s): its in-flight estimate is lost; restarting it at step %d",
                               e.worker, type(e.error).__name__, self.version)
        for w in self.pool.due_resets():  # at once: Ray queues the reset until the actor is back
            self._reset_worker(w)
        return events

    # ---- evaluation ------------------------------------------------------------------------------------------
    def _poll_eval(self, block: bool = False) -> None:
        if self.evals is None:
            return
        done = self.evals.poll(timeout_s=self.stall_timeout_s if block else 0.0)
        if done is None:
            return
        step, state, metrics = done
        self.eval_pending = dict(metrics, **{"eval/step": step})
        best = self.ckpt.policy.best_metric
        if best and best in metrics and self.ckpt.manager is not None:
            meta = dict(self.ckpt.meta, **self.reporter.totals().as_meta())
            self.ckpt.manager.save_best(step, state, metrics[best], meta)

    # ---- one update --------------------------------------------------------------------------------------
    def _apply(self, step: int, target: int, entries: list, reporter, callback) -> None:
        """entries: [(estimator index, Estimate, staleness)] of this update."""
        ests = [e for _, e, _ in entries]
        w = [self.weights[i] for i, _, _ in entries]
        learner_state, metrics = self.learner.update(self.state.learner_state, ests, w)
        key, _ = jax.random.split(self.state.key)
        if self.synchronous:
            key = self._next_key
        self.state = OuterTrainState(learner_state, (), key, jnp.asarray(step, jnp.int32))
        self.version = step
        self.theta_ref = self.ray.put(_numpy(self.state.theta))
        self.stats.applied([s for _, _, s in entries])
        metrics = dict(metrics, **self.stats.metrics([s for _, _, s in entries], self.pool), **self.timing)
        labels = _unique_labels([self.labels[i] for i, _, _ in entries])
        if self.evals is not None:
            if step == target and self.evals.in_flight:
                self._poll_eval(block=True)
            else:
                self._poll_eval()
        forced = bool(self.eval_pending)
        if forced:  # log the finished evaluation with this step, whatever log_every says
            pending, self.eval_pending = self.eval_pending, {}
            reporter.meta_evaluator, reporter.eval_every = (lambda theta: pending), 1
        try:
            logged = reporter.report(step, metrics, labels=labels,
                                     inner_steps=sum(self.estimators[i].inner_steps_per_estimate
                                                     for i, _, _ in entries), theta=self.state.theta)
        finally:
            reporter.meta_evaluator, reporter.eval_every = None, 0
        best = self.ckpt.policy.best_metric
        saved = None if logged is None else {k: v for k, v in logged.items() if k != best}
        self.ckpt.save(step, self.state, reporter.totals(), saved, final=step == target)
        if self.evals is not None:
            self.evals.maybe_submit(step, self.theta_ref, self.state)
        if logged is not None and callback is not None:
            callback(step, self.state, logged)

    def run(self, target: int, reporter, callback) -> OuterTrainState:
        self.reporter = reporter
        if self.evals is not None:
            self.evals.maybe_submit(self.version, self.theta_ref, self.state)
        if self.synchronous:
            self._run_sync(target, reporter, callback)
        else:
            self._run_async(target, reporter, callback)
        return self.state

    def _run_sync(self, target: int, reporter, callback) -> None:
        for i in range(self.state.step, target):
            got: dict = {}
            while not got:  # a round whose every worker died applies nothing: ask the restarted ones again
                t0 = time.perf_counter()
                got = self._sync_round(i)
            self.timing = {"timing/round_s": time.perf_counter() - t0, "timing/worker_s": self._worker_s}
            self._apply(i + 1, target, [(idx, got[idx], 0) for idx in sorted(got)], reporter, callback)

    def _sync_round(self, i: int) -> dict:
        """Every ready worker estimates at the current theta with `outer_step`'s keys of step i."""
        pool = self.pool
        while pool.starting() or not pool.idle_ready():  # all but the recovering ones take part
            self._wait()
        key, *keys = jax.random.split(self.state.key, self.K + 1)
        self._next_key = key
        asked = pool.idle_ready()
        for w in asked:
            pool.estimate(w, self.theta_ref, self.version, key_data(keys, pool.assignment[w]), i)
        got: dict = {}
        self._worker_s = 0.0
        waiting = set(asked)
        while waiting:
            for e in self._wait():
                if e.worker in waiting and e.kind in ("estimate", "failed"):
                    waiting.discard(e.worker)
                    if e.kind == "estimate":
                        got.update(e.payload[1])
                        self._worker_s = max(self._worker_s, e.payload[2])
        return got

    def _dispatch_async(self, w: int) -> None:
        self.dispatches += 1
        base = jax.random.fold_in(jax.random.fold_in(self.state.key, 7919), self.dispatches)
        keys = list(jax.random.split(base, self.K))
        self.pool.estimate(w, self.theta_ref, self.version, key_data(keys, self.pool.assignment[w]), self.version)

    def _run_async(self, target: int, reporter, callback) -> None:
        pool = self.pool
        buffer: list = []  # (estimator index, Estimate, version)
        while pool.starting():  # a fair start: every worker's first estimate is at the same theta
            self._wait()
        while self.version < target:
            for w in pool.idle_ready():
                self._dispatch_async(w)
            for e in self._wait():
                if e.kind != "estimate":
                    continue
                version, estimates, _ = e.payload
                for idx, est in estimates.items():
                    if self.version - version > self.max_staleness:
                        self.stats.dropped(self.version - version)
                    else:
                        buffer.append((idx, est, version))
            while len(buffer) >= self.per_step and self.version < target:
                take, buffer = buffer[:self.per_step], buffer[self.per_step:]
                self._apply(self.version + 1, target, [(i, est, self.version - v) for i, est, v in take],
                            reporter, callback)
                for b in buffer:
                    if self.version - b[2] > self.max_staleness:
                        self.stats.dropped(self.version - b[2])
                buffer = [b for b in buffer if self.version - b[2] <= self.max_staleness]

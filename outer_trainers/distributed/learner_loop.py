"""The learner's side of `ray_outer_train` once the workers run: `LearnerLoop`, its synchronous and
asynchronous loops over a `WorkerPool` (what each mode does: `distributed.learner`).

The loop sends theta (one `ray.put` per version) with each worker's keys, collects estimates,
applies updates with `GradientLearner.update` (which also carries the moving average of theta
when the learner keeps one), reports and checkpoints each step, re-initialises the particles of
restarted workers, and polls the evaluation actor. The evaluation actor gets the run's result
theta (`OuterTrainState.final_theta`, the average with `theta_ema`), as `outer_train`'s
meta-evaluation and validation do.

Validation (theta_best): every `validation_every` steps the result theta is sent to the
evaluation actor, none skipped. A finished validation goes through the run's `ThetaBest` (the
same selection `outer_train` keeps: an improvement writes theta_best.msgpack and theta_best.json
with the validated step's theta), its metrics are logged with the step it arrives at (with
"valid/step", the validated step), and a baseline the actor tuned is written to the run's cache
file. Before a checkpoint is written the loop waits for the validations of the steps it covers,
so a run resumed from that checkpoint has lost none of them (the steps after it are run, and
validated, again).
"""
from __future__ import annotations

import logging
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from outer_trainers.distributed.learner_state import particle_keys
from outer_trainers.distributed.worker import key_data
from outer_trainers.distributed.worker_pool import WorkerPool
from outer_trainers.learner.outer_train import OuterTrainState
from outer_trainers.evaluation.report import json_safe, write_json
from outer_trainers.learner.run_records import estimator_labels

logger = logging.getLogger("outer_trainers")


def stall_warning_s(stall_timeout_s: float) -> float:
    """Seconds without any worker answering, while some restart, after which the loop warns once (naming
    them) before `stall_timeout_s` stops the run: a tenth of it, at most a minute."""
    return min(60.0, stall_timeout_s / 10)


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


class LearnerLoop:
    """The learner's loop over outer steps (synchronous or asynchronous), over a WorkerPool; `run(target, ...)`.

    Built by `ray_outer_train` once the run's state is restored; it resets every worker at the
    current theta when built.

    Args:
      learner: the `GradientLearner` that applies the averaged estimates to theta.
      estimators: the run's `GradientEstimator`s (one label each in the metrics).
      weights: each estimator's weight in the average (`check_weights`).
      state: the restored (or initial) learner state; its step is theta's version.
      seed: the run's seed, from which the particles' keys are drawn.
      pool: the `WorkerPool` of estimator actors.
      evals: the evaluation actor's client (`EvalClient`), or None.
      run: the run's `RunCheckpoints` (checkpoints and their policy).
      max_staleness: the most versions an applied estimate may lag theta.
      per_step: estimates applied per outer step.
      synchronous: one estimate of every estimator per step, each computed at the current theta.
      stall_timeout_s: seconds without any worker answering before the run stops with an error.
      ray: the imported `ray` module.
      theta_best: the run's `learner.theta_best.ThetaBest` when `evals` validates theta, else None.
      baseline_cache: where the validation baseline the actor tunes is written (None: not written).
    """

    def __init__(self, learner, estimators, weights, state, seed, pool, evals, run, max_staleness, per_step,
                 synchronous, stall_timeout_s, ray, theta_best=None, baseline_cache=None):
        self.learner, self.estimators, self.weights = learner, estimators, weights
        self.labels = estimator_labels(estimators)
        self.state, self.seed, self.pool, self.evals, self.ckpt = state, seed, pool, evals, run
        self.max_staleness, self.per_step, self.synchronous = max_staleness, per_step, synchronous
        self.stall_timeout_s, self.ray = stall_timeout_s, ray
        self.theta_best, self.baseline_cache = theta_best, baseline_cache
        self.stats = _Stats(max_staleness)
        self.K = len(estimators)
        self.version = int(state.step)
        self.theta_ref = ray.put(_numpy(state.theta))
        self.resets = 0
        self.dispatches = 0
        self.eval_pending: dict = {}
        self._last_answer = time.monotonic()
        self._stall_warned = False
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
        if not self._stall_warned and any(self.pool.recovering):  # wake up in time to say that the run waits
            timeout = min(timeout, max(0.0, self._last_answer + stall_warning_s(self.stall_timeout_s) - time.monotonic()))
        events = self.pool.wait(timeout, num_returns=num_returns)
        now = time.monotonic()
        if any(e.kind != "failed" for e in events):
            self._last_answer, self._stall_warned = now, False
        elif now - self._last_answer > self.stall_timeout_s:
            raise RuntimeError(f"no worker answered for {self.stall_timeout_s:g} s ({self.pool.in_flight()} calls in "
                               f"flight, {sum(self.pool.ready)} of {len(self.pool)} workers ready): the cluster may "
                               f"lack the resources to (re)start them")
        elif (not self._stall_warned and any(self.pool.recovering)
              and now - self._last_answer >= stall_warning_s(self.stall_timeout_s)):
            self._stall_warned = True
            restarting = [w for w in range(len(self.pool)) if self.pool.recovering[w]]
            logger.warning("no worker has answered for %.0f s at step %d while workers %s restart (%d of %d ready): "
                           "a restarted worker needs a free CPU on some node, and a synchronous step waits for every "
                           "worker. The run stops with an error after stall_timeout_s = %g s without an answer",
                           now - self._last_answer, self.version, restarting, sum(self.pool.ready), len(self.pool),
                           self.stall_timeout_s)
        for e in events:
            if e.kind == "failed" and e.payload == "estimate":
                logger.warning("worker %d failed (%s): its in-flight estimate is lost; restarting it at step %d",
                               e.worker, type(e.error).__name__, self.version)
        for w in self.pool.due_resets():  # at once: Ray queues the reset until the actor is back
            self._reset_worker(w)
        return events

    # ---- evaluation ------------------------------------------------------------------------------------------
    def _poll_eval(self, block: bool = False) -> None:
        if self.evals is None or not self.evals.evaluates:
            return
        done = self.evals.poll(timeout_s=self.stall_timeout_s if block else 0.0)
        if done is None:
            return
        step, state, metrics = done
        self.eval_pending = dict(metrics, **{"eval/step": step})
        self._save_best(step, state, metrics)

    def _save_best(self, step: int, state: OuterTrainState, metrics: dict) -> None:
        """A "best" checkpoint of the evaluated step's state when `metrics` holds the policy's best metric."""
        best = self.ckpt.policy.best_metric
        if best and best in metrics and self.ckpt.manager is not None:
            meta = dict(self.ckpt.meta, **self.reporter.totals().as_meta())
            self.ckpt.manager.save_best(step, state, metrics[best], meta)

    def _poll_validations(self, wait_through) -> dict:
        """The finished validations through the run's ThetaBest; the last one's metrics (with "valid/step")."""
        logged: dict = {}
        if self.theta_best is None:
            return logged
        for v in self.evals.poll_validations(wait_through, timeout_s=self.stall_timeout_s):
            if v.baselines is not None and self.baseline_cache is not None:
                write_json(self.baseline_cache, json_safe(v.baselines))
            averaged = v.state.learner_state.theta_avg is not None
            logged = dict(self.theta_best.record(v.step, v.theta, v.metrics, averaged=averaged),
                          **{"valid/step": v.step})
            self._save_best(v.step, v.state, logged)
        return logged

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
        final = step == target
        if self.evals is not None:
            self._poll_eval(block=final and self.evals.in_flight)
            if self.theta_best is not None:
                self.evals.submit_validation(step, _numpy(self.state.final_theta), self.state)
        # before a checkpoint: every validation of the steps it covers is in (a resume re-validates the rest)
        ckpt_due = self.ckpt.manager is not None and self.ckpt.manager.due(step, time.perf_counter(), final=final)
        extra = self._poll_validations(step if ckpt_due or final else None)
        if self.eval_pending:  # log the finished evaluation with this step, whatever log_every says
            extra, self.eval_pending = dict(self.eval_pending, **extra), {}
        logged = reporter.report(step, metrics, labels=labels,
                                 inner_steps=sum(self.estimators[i].inner_steps_per_estimate for i, _, _ in entries),
                                 theta=self.state.final_theta, extra=extra or None)
        best = self.ckpt.policy.best_metric
        saved = None if logged is None else {k: v for k, v in logged.items() if k != best}
        self.ckpt.save(step, self.state, reporter.totals(), saved, final=final)
        if self.evals is not None and self.evals.due(step):
            self.evals.maybe_submit(step, self.ray.put(_numpy(self.state.final_theta)), self.state)
        if logged is not None and callback is not None:
            callback(step, self.state, logged)

    def run(self, target: int, reporter, callback) -> OuterTrainState:
        """Runs outer steps until step `target`, reporting each and calling `callback(step, state, metrics)`.

        Args:
          target: the step to train to.
          reporter: the run's `runs.reporting.Reporter`.
          callback: called after every outer step, or None.

        Returns:
          the learner state at `target`.
        """
        self.reporter = reporter
        if self.evals is not None and self.evals.due(self.version):
            self.evals.maybe_submit(self.version, self.ray.put(_numpy(self.state.final_theta)), self.state)
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

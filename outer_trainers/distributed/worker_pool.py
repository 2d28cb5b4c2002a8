"""WorkerPool: the learner's view of its Ray worker actors — calls in flight, failures, restarts.

    pool = WorkerPool(make_run, assignment=[(0, 2), (1, 3)])      # 2 actors, 2 estimators each
    pool.reset(w, theta_ref, keys, step)                          # (re)initialise a worker's particles
    pool.estimate(w, theta_ref, version, keys, step)
    for event in pool.wait(timeout_s): ...                        # Event(kind, worker, payload, error)

Every actor is created with `max_restarts` (Ray restarts a dead actor process, e.g. one killed
with SIGKILL or on a removed node, re-running its constructor) and task retries. A call in
flight when its actor dies fails with a RayActorError, or is delivered again to the restarted
actor, which has no particles and says so; `wait` turns either into a "failed" event: the
in-flight estimate is lost, the worker is marked not ready ("recovering") and counted as
restarted once, and `due_resets` tells the learner to send it a `reset` at the current theta. A
reset refused because Ray is still restarting the actor is due again `RETRY_S` later; an actor
that is dead for good (its restarts exhausted) is replaced by a new one. An exception raised by
the worker's own code (a bug, a bad config) is not a fault: it is re-raised, and so is a
constructor that fails (e.g. `make_run` not importable in the worker), as a RuntimeError.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Optional, Sequence

from outer_trainers.distributed.cluster import import_ray
from outer_trainers.distributed.worker import EstimatorWorker

RETRY_S = 0.5  # a reset sent while Ray is still restarting the actor is sent again after this long


@dataclasses.dataclass
class Event:
    """One finished call of a worker.

    Attributes:
        kind: "reset", "estimate" or "failed" (the worker's process or node died during the call).
        worker: the worker's index in the pool.
        payload: the call's result ("estimate": (version, {index: Estimate}, seconds)); for
            "failed", the kind of call that was lost.
        error: the Ray error of a "failed" call, else None.
    """
    kind: str
    worker: int
    payload: Any = None
    error: Optional[BaseException] = None


def assign_estimators(num_estimators: int, num_workers: int) -> list[tuple[int, ...]]:
    """Estimator indices per worker: worker w owns the estimators i with i % num_workers == w.

    Args:
        num_estimators: K, the run's estimators (>= num_workers).
        num_workers: N, the workers (>= 1).

    Returns:
        N tuples of indices covering 0..K-1 once each.

    Raises:
        ValueError: N < 1, or N > K (a worker would own no estimator).
    """
    if num_workers < 1:
        raise ValueError(f"num_workers must be >= 1, got {num_workers}")
    if num_workers > num_estimators:
        raise ValueError(f"{num_workers} workers for {num_estimators} estimators: every worker needs at least one "
                         f"estimator. Use at most {num_estimators} workers, or list more estimators (e.g. repeat "
                         f"them: scripts/outer_train.py does so when train.num_workers exceeds their number)")
    return [tuple(range(w, num_estimators, num_workers)) for w in range(num_workers)]


class WorkerPool:
    """Ray actors running `EstimatorWorker`s, with the calls in flight and the faults seen.

    Args:
        make_run: the run's picklable description, `make_run() -> (learner, estimators)`.
        assignment: per worker, the estimator indices it owns (see `assign_estimators`).
        actor_options: per worker, extra Ray actor options (e.g. `resources`, `scheduling_strategy`), or None.
        runtime_env: the actors' Ray runtime environment (see `cluster.worker_runtime_env`).
        num_cpus: CPUs each actor reserves.
        max_restarts: how often Ray may restart each actor (-1: without limit).

    Attributes:
        ready: per worker, whether its particles are initialised and it takes estimates.
        busy: per worker, whether a call is in flight.
        recovering: per worker, whether it failed and has not been reset since.
        restarts: worker failures seen (each costs its in-flight call and is followed by a reset).
        lost_estimates: estimates lost in calls whose worker died.
    """

    def __init__(self, make_run: Callable[[], tuple], assignment: Sequence[Sequence[int]], *,
                 actor_options: Optional[Sequence[Optional[dict]]] = None, runtime_env: Optional[dict] = None,
                 num_cpus: float = 1, max_restarts: int = -1):
        ray = import_ray()
        self._ray = ray
        self.assignment = [tuple(a) for a in assignment]
        n = len(self.assignment)
        actor_options = list(actor_options) if actor_options is not None else [None] * n
        if len(actor_options) != n:
            raise ValueError(f"{len(actor_options)} actor_options for {n} workers")
        self._make_run, self._remote_cls = make_run, ray.remote(EstimatorWorker)
        self._options = []
        for extra in actor_options:
            # with restarts, Ray holds calls sent while an actor restarts and delivers them to the new
            # process (an estimate retried there finds no particles and reports it, so it is still counted lost)
            opts = dict(num_cpus=num_cpus, max_restarts=max_restarts, max_task_retries=-1 if max_restarts else 0)
            if runtime_env:
                opts["runtime_env"] = runtime_env
            opts.update(extra or {})
            self._options.append(opts)
        self.ready = [False] * n
        self.busy = [False] * n
        self.recovering = [False] * n
        self.restarts = 0
        self.lost_estimates = 0
        self._pending: dict = {}  # ObjectRef -> (kind, worker)
        self._reset_due: dict = {}  # worker -> time.monotonic() from when its next reset is due
        self.actors = [self._make_actor(w) for w in range(n)]

    def _make_actor(self, w: int):
        return self._remote_cls.options(**self._options[w]).remote(self._make_run, self.assignment[w])

    def __len__(self) -> int:
        return len(self.actors)

    def reset(self, w: int, theta_ref: Any, keys: dict, outer_iteration: int) -> None:
        """Sends worker `w` fresh particle states at theta (`ready` once it finishes).

        Args:
            w: the worker.
            theta_ref: theta, or a Ray ObjectRef of it.
            keys: {estimator index: key data} for all of the worker's estimators.
            outer_iteration: the learner's outer step.
        """
        self.ready[w], self.busy[w] = False, True
        self._reset_due.pop(w, None)
        self._pending[self.actors[w].reset.remote(theta_ref, keys, outer_iteration)] = ("reset", w)

    def estimate(self, w: int, theta_ref: Any, version: int, keys: dict, outer_iteration: int) -> None:
        """Asks ready worker `w` for one estimate per estimator it owns at theta of `version`.

        Args:
            w: the worker (ready and not busy).
            theta_ref: theta, or a Ray ObjectRef of it.
            version: theta's version (the learner's update count).
            keys: {estimator index: key data}, one per estimator the worker owns.
            outer_iteration: the learner's outer step.
        """
        assert self.ready[w] and not self.busy[w], f"worker {w} is not ready for an estimate"
        self.busy[w] = True
        self._pending[self.actors[w].estimate.remote(theta_ref, version, keys, outer_iteration)] = ("estimate", w)

    def idle_ready(self) -> list[int]:
        """The workers that are ready and have no call in flight."""
        return [w for w in range(len(self)) if self.ready[w] and not self.busy[w]]

    def starting(self) -> list[int]:
        """The workers whose first reset has not finished (not ready, and not recovering from a failure)."""
        return [w for w in range(len(self)) if not self.ready[w] and not self.recovering[w]]

    def in_flight(self) -> int:
        """The number of calls in flight."""
        return len(self._pending)

    def due_resets(self) -> list[int]:
        """The recovering workers whose reset is due now (the learner then calls `reset`)."""
        now = time.monotonic()
        return [w for w, t in self._reset_due.items() if t <= now]

    def next_reset_in(self) -> Optional[float]:
        """Seconds until the next reset is due (0 if one is due now), or None when none is pending."""
        if not self._reset_due:
            return None
        return max(0.0, min(self._reset_due.values()) - time.monotonic())

    def wait(self, timeout_s: Optional[float], num_returns: int = 1) -> list[Event]:
        """Waits for at least `num_returns` calls in flight (or `timeout_s`) and returns all finished ones.

        Args:
            timeout_s: the longest wait (None: no limit).
            num_returns: how many finished calls to wait for (capped at those in flight).

        Returns:
            The finished calls as Events (possibly none after a timeout).

        Raises:
            ray.exceptions.RayTaskError: a worker's own code raised (re-raised with the worker's traceback).
        """
        ray = self._ray
        if not self._pending:
            return []
        refs = list(self._pending)
        done, _ = ray.wait(refs, num_returns=min(num_returns, len(refs)), timeout=timeout_s)
        if done:  # collect everything else that has finished too, without waiting
            rest = [r for r in refs if r not in done]
            if rest:
                more, _ = ray.wait(rest, num_returns=len(rest), timeout=0)
                done = list(done) + list(more)
        events = []
        for ref in done:
            kind, w = self._pending.pop(ref)
            self.busy[w] = False
            try:
                result = ray.get(ref)
            except ray.exceptions.RayTaskError:
                raise
            except ray.exceptions.ActorUnavailableError as e:  # restarting (or unreachable for now)
                self._failed(w, kind, retry_after_s=RETRY_S if kind == "reset" else 0.0)
                events.append(Event("failed", w, kind, e))
                continue
            except ray.exceptions.ActorDiedError as e:  # dead for good (restarts exhausted): replace it
                if getattr(e, "actor_init_failed", False):  # its constructor raised: a bad run description
                    raise RuntimeError(f"worker {w} could not be built (make_run failed or could not be unpickled "
                                       f"in the worker's process): {e}") from None
                self._failed(w, kind)
                self._recreate(w)
                events.append(Event("failed", w, kind, e))
                continue
            except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError, ray.exceptions.NodeDiedError,
                    ray.exceptions.WorkerCrashedError) as e:
                self._failed(w, kind)
                events.append(Event("failed", w, kind, e))
                continue
            if kind == "estimate" and result[1] is None:  # the actor restarted between calls: particles lost
                self._failed(w, kind)
                events.append(Event("failed", w, kind, RuntimeError(f"worker {w} was restarted and lost its "
                                                                    f"particles")))
                continue
            if kind == "reset":
                self.ready[w], self.recovering[w] = True, False
            events.append(Event(kind, w, result))
        return events

    def _failed(self, w: int, kind: str, retry_after_s: float = 0.0) -> None:
        """Books a failed call: the first failure of a healthy worker counts a restart (and an estimate call
        its lost estimates); a reset refused while the worker is still restarting is only retried later."""
        if not self.recovering[w]:
            self.restarts += 1
        if kind == "estimate":
            self.lost_estimates += len(self.assignment[w])
        self.ready[w], self.recovering[w] = False, True
        self._reset_due[w] = time.monotonic() + retry_after_s

    def _recreate(self, w: int) -> None:
        try:
            self._ray.kill(self.actors[w], no_restart=True)
        except Exception:  # already gone
            pass
        self.actors[w] = self._make_actor(w)

    def call(self, w: int, method: str, timeout_s: float = 120.0) -> Any:
        """Calls a query method of worker `w` ("pid", "node_id", "compiles") and returns its result.

        Args:
            w: the worker.
            method: the EstimatorWorker method (without arguments).
            timeout_s: the longest wait.

        Returns:
            The method's result.
        """
        return self._ray.get(getattr(self.actors[w], method).remote(), timeout=timeout_s)

    def shutdown(self) -> None:
        """Kills the actors (no restart); calls in flight are abandoned."""
        for actor in self.actors:
            try:
                self._ray.kill(actor, no_restart=True)
            except Exception:  # an actor already gone
                pass
        self._pending.clear()

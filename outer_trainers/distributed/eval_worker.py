"""Continuous evaluation off the learner's critical path: an evaluation actor and when to call it.

    ev = EvalClient(make_evaluator, every_steps=10, every_seconds=None)  # starts the actor
    ev.maybe_submit(step, theta_ref, state)      # when due and the actor is idle
    done = ev.poll()                              # None, or (step, state at that step, {"eval/...": ...})

The actor builds its evaluator from `make_evaluator()` (a picklable factory, e.g. of a
`MetaEvaluator`, so no jitted function is pickled) and trains the held-out tasks with the theta
it is sent. The learner keeps applying updates meanwhile; when an evaluation finishes, its
metrics are logged with the next step (with "eval/step", the step whose theta was evaluated)
and, through the state kept for that step, feed "best" checkpoints.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp

from outer_trainers.distributed.cluster import import_ray


class EvalWorker:
    """Runs an evaluator inside a Ray actor.

    Args:
        make_evaluator: picklable `make_evaluator() -> evaluator`, with `evaluator(theta) -> {name: float}`
            (e.g. a MetaEvaluator).
    """

    def __init__(self, make_evaluator: Callable[[], Callable[[Any], dict]]):
        self.evaluator = make_evaluator()

    def evaluate(self, theta: Any, step: int) -> tuple[int, dict]:
        """The evaluator's metrics for `theta`.

        Args:
            theta: theta (pytree of arrays).
            step: the learner's step that produced theta (returned with the metrics).

        Returns:
            (step, {name: float}).
        """
        metrics = self.evaluator(jax.tree_util.tree_map(jnp.asarray, theta))
        return int(step), {k: float(v) for k, v in metrics.items()}


class EvalClient:
    """The learner's side of one evaluation actor: schedules evaluations and collects their results.

    Args:
        make_evaluator: picklable factory of the evaluator (see `EvalWorker`).
        every_steps: evaluate once `every_steps` steps have passed since the last evaluation (0: not by steps).
        every_seconds: evaluate once this many seconds have passed since the last one (None: not by time).
        runtime_env: the actor's Ray runtime environment.
        num_cpus: CPUs the actor reserves.
        actor_options: extra Ray actor options, or None.
    """

    def __init__(self, make_evaluator: Callable, *, every_steps: int = 0, every_seconds: Optional[float] = None,
                 runtime_env: Optional[dict] = None, num_cpus: float = 1, actor_options: Optional[dict] = None):
        if every_steps < 0 or (every_seconds is not None and every_seconds <= 0):
            raise ValueError(f"eval_every_steps must be >= 0 and eval_every_seconds > 0 or None, got {every_steps}, "
                             f"{every_seconds}")
        if not every_steps and every_seconds is None:
            raise ValueError("an evaluation actor needs eval_every_steps > 0 or eval_every_seconds")
        ray = import_ray()
        self._ray = ray
        opts = dict(num_cpus=num_cpus, max_restarts=-1, max_task_retries=0)
        if runtime_env:
            opts["runtime_env"] = runtime_env
        opts.update(actor_options or {})
        self.actor = ray.remote(EvalWorker).options(**opts).remote(make_evaluator)
        self.every_steps, self.every_seconds = every_steps, every_seconds
        self._last_step: Optional[int] = None
        self._last_time = time.perf_counter()
        self._ref = None
        self._state = None
        self.failures = 0

    def due(self, step: int) -> bool:
        """Whether an evaluation of theta at `step` is due: the actor is idle, and `every_steps` steps or
        `every_seconds` seconds have passed since the last one (never twice at one step).

        Args:
            step: the learner's step.

        Returns:
            Whether `maybe_submit(step, ...)` would start an evaluation.
        """
        if self._ref is not None:
            return False
        by_steps = self.every_steps and (step - (self._last_step or 0)) >= self.every_steps
        by_time = self.every_seconds is not None and time.perf_counter() - self._last_time >= self.every_seconds
        return bool(by_steps or by_time) and step != self._last_step

    def maybe_submit(self, step: int, theta_ref: Any, state: Any) -> bool:
        """Starts an evaluation of theta at `step` if one is due.

        Args:
            step: the learner's step.
            theta_ref: theta (or its Ray ObjectRef).
            state: the learner's state at `step` (kept for a "best" checkpoint).

        Returns:
            Whether an evaluation was started.
        """
        if not self.due(step):
            return False
        self._ref = self.actor.evaluate.remote(theta_ref, step)
        self._state, self._last_step, self._last_time = state, step, time.perf_counter()
        return True

    @property
    def in_flight(self) -> bool:
        """Whether an evaluation is running."""
        return self._ref is not None

    def poll(self, timeout_s: float = 0.0) -> Optional[tuple[int, Any, dict]]:
        """A finished evaluation, or None.

        Args:
            timeout_s: how long to wait for the running evaluation.

        Returns:
            (evaluated step, the learner's state at that step, metrics) or None (nothing finished, or the
            evaluation was lost because its actor died: counted in `failures`, the next one is scheduled).
        """
        ray = self._ray
        if self._ref is None:
            return None
        done, _ = ray.wait([self._ref], timeout=timeout_s)
        if not done:
            return None
        ref, state, self._ref, self._state = self._ref, self._state, None, None
        try:
            step, metrics = ray.get(ref)
        except ray.exceptions.RayTaskError:
            raise
        except ray.exceptions.RayError:
            self.failures += 1
            return None
        return step, state, metrics

    def shutdown(self) -> None:
        """Kills the actor."""
        try:
            self._ray.kill(self.actor, no_restart=True)
        except Exception:  # already gone
            pass

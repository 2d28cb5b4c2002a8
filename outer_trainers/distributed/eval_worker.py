"""Continuous evaluation off the learner's critical path: an evaluation actor and when to call it.

    settings = EvalActor(make_evaluator, every_steps=10)                 # what ray_outer_train is given
    ev = EvalClient(make_evaluator, every_steps=10, every_seconds=None)  # starts the actor
    ev.maybe_submit(step, theta_ref, state)      # when due and the actor is idle
    done = ev.poll()                              # None, or (step, state at that step, {"eval/...": ...})

    ev = EvalClient(None, make_validation=make_selector, validation_every=250, baselines=doc)
    ev.submit_validation(step, theta, state)      # every validation_every steps: queued, never skipped
    for v in ev.poll_validations(): ...           # Validated(step, theta, state, metrics, baselines)

The actor builds its evaluator from `make_evaluator()` (a picklable factory, e.g. of a
`MetaEvaluator`, so no jitted function is pickled) and trains the held-out tasks with the theta
it is sent. The learner keeps applying updates meanwhile; when an evaluation finishes, its
metrics are logged with the next step (with "eval/step", the step whose theta was evaluated)
and, through the state kept for that step, feed "best" checkpoints.

Validation selection (theta_best) runs in the same actor: `make_validation()` builds a
`ValidationSelector` there, which scores every theta it is sent, in the order sent. Unlike
meta-evaluation, no validation is skipped while the actor is busy, so a run validates the same
steps as a local run does. The actor writes no file: the learner hands it the tuned baseline
read from the run's cache (`baselines`) and receives the baseline the actor tuned when it had
none, to write the cache itself.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from outer_trainers.distributed.cluster import import_ray

MAX_VALIDATION_TRIES = 3  # a validation lost with its actor is sent again, this often in all


@dataclasses.dataclass(frozen=True)
class EvalActor:
    """What the evaluation actor of `ray_outer_train` runs, and when: meta-evaluation and validation.

    Attributes:
        make_evaluator: picklable `make_evaluator() -> evaluator` (e.g. of a MetaEvaluator), or None.
        every_steps: meta-evaluate once this many steps have passed since the last one (0: not by steps).
        every_seconds: meta-evaluate once this many seconds have passed since the last one (None: not by time).
        make_validation: picklable `make_validation() -> ValidationSelector` (built in the learner too, for the
            theta_best record), or None.
        validation_every: validate the result theta of every step divisible by this (0: none).
    """
    make_evaluator: Optional[Callable[[], Callable[[Any], dict]]] = None
    every_steps: int = 0
    every_seconds: Optional[float] = None
    make_validation: Optional[Callable[[], Any]] = None
    validation_every: int = 0

    def __post_init__(self):
        if self.every_steps < 0 or (self.every_seconds is not None and self.every_seconds <= 0):
            raise ValueError(f"EvalActor: every_steps must be >= 0 and every_seconds > 0 or None, got "
                             f"{self.every_steps}, {self.every_seconds}")
        if (self.make_validation is None) != (self.validation_every < 1):
            raise ValueError(f"EvalActor: validation needs both make_validation and validation_every >= 1, got "
                             f"make_validation={self.make_validation!r}, validation_every={self.validation_every}")

    @property
    def evaluates(self) -> bool:
        """Whether meta-evaluation runs (an evaluator and a schedule)."""
        return self.make_evaluator is not None and bool(self.every_steps or self.every_seconds)

    @property
    def validates(self) -> bool:
        """Whether validation runs."""
        return self.make_validation is not None


class Validated(NamedTuple):
    """A finished validation, as `EvalClient.poll_validations` returns it.

    Attributes:
        step: the outer step whose theta was validated.
        theta: that theta (numpy pytree; the run's `final_theta` at `step`).
        state: the learner's state at `step` (for a "best" checkpoint).
        metrics: the selector's "valid/..." metrics of theta.
        baselines: the baseline cache document the actor tuned for this call, or None when it had one.
    """
    step: int
    theta: Any
    state: Any
    metrics: dict
    baselines: Optional[dict]


class EvalWorker:
    """Runs an evaluator and a validation selector inside a Ray actor.

    Args:
        make_evaluator: picklable `make_evaluator() -> evaluator`, with `evaluator(theta) -> {name: float}`
            (e.g. a MetaEvaluator), or None.
        make_validation: picklable `make_validation() -> ValidationSelector`, or None.
    """

    def __init__(self, make_evaluator: Optional[Callable[[], Callable[[Any], dict]]],
                 make_validation: Optional[Callable[[], Any]] = None):
        self.evaluator = make_evaluator() if make_evaluator is not None else None
        self.selector = make_validation() if make_validation is not None else None
        if self.selector is not None:
            self.selector.cache_path = None  # the learner owns the run's files: it reads and writes the cache

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

    def validate(self, theta: Any, step: int, baselines: Optional[dict]) -> tuple[int, dict, Optional[dict]]:
        """The validation selector's metrics for `theta` (`ValidationSelector.__call__`, no cache file).

        Args:
            theta: theta (pytree of arrays).
            step: the learner's step that produced theta (returned with the metrics).
            baselines: the run's cached baseline document, or None (then the actor tunes the baseline once).

        Returns:
            (step, {"valid/...": number}, the baseline document when this call tuned it, else None).
        """
        sel = self.selector
        if sel.baseline_document() is None and baselines is not None:
            sel.use_baselines(baselines)
        tuned_before = sel.baseline_computations
        metrics = sel(jax.tree_util.tree_map(jnp.asarray, theta))
        tuned = sel.baseline_document() if sel.baseline_computations > tuned_before else None
        return int(step), metrics, tuned


class EvalClient:
    """The learner's side of one evaluation actor: schedules evaluations and collects their results.

    Args:
        make_evaluator: picklable factory of the evaluator (see `EvalWorker`), or None (validation only).
        every_steps: evaluate once `every_steps` steps have passed since the last evaluation (0: not by steps).
        every_seconds: evaluate once this many seconds have passed since the last one (None: not by time).
        make_validation: picklable factory of the run's `ValidationSelector` (see `EvalWorker`), or None.
        validation_every: validate theta at every step divisible by it (with `make_validation`).
        baselines: the run's cached validation baseline document (`ValidationSelector.read_cache`), or None.
        runtime_env: the actor's Ray runtime environment.
        num_cpus: CPUs the actor reserves.
        actor_options: extra Ray actor options, or None.
    """

    def __init__(self, make_evaluator: Optional[Callable], *, every_steps: int = 0,
                 every_seconds: Optional[float] = None, make_validation: Optional[Callable] = None,
                 validation_every: int = 0, baselines: Optional[dict] = None, runtime_env: Optional[dict] = None,
                 num_cpus: float = 1, actor_options: Optional[dict] = None):
        if every_steps < 0 or (every_seconds is not None and every_seconds <= 0):
            raise ValueError(f"eval_every_steps must be >= 0 and eval_every_seconds > 0 or None, got {every_steps}, "
                             f"{every_seconds}")
        if make_evaluator is not None and not every_steps and every_seconds is None:
            raise ValueError("an evaluation actor needs eval_every_steps > 0 or eval_every_seconds")
        if (make_validation is None) != (validation_every < 1):
            raise ValueError(f"validation needs both make_validation and validation_every >= 1, got "
                             f"make_validation={make_validation!r}, validation_every={validation_every}")
        if make_evaluator is None and make_validation is None:
            raise ValueError("an evaluation actor needs make_evaluator or make_validation")
        ray = import_ray()
        self._ray = ray
        opts = dict(num_cpus=num_cpus, max_restarts=-1, max_task_retries=0)
        if runtime_env:
            opts["runtime_env"] = runtime_env
        opts.update(actor_options or {})
        self.actor = ray.remote(EvalWorker).options(**opts).remote(make_evaluator, make_validation)
        self.evaluates = make_evaluator is not None
        self.every_steps, self.every_seconds = every_steps, every_seconds
        self.validation_every = validation_every
        self._last_step: Optional[int] = None
        self._last_time = time.perf_counter()
        self._ref = None
        self._state = None
        self._baselines = None if baselines is None else ray.put(baselines)
        self._validations: list = []  # [step, theta, state, ObjectRef, tries], in the order sent
        self.failures = 0

    def due(self, step: int) -> bool:
        """Whether an evaluation of theta at `step` is due: the actor is idle, and `every_steps` steps or
        `every_seconds` seconds have passed since the last one (never twice at one step).

        Args:
            step: the learner's step.

        Returns:
            Whether `maybe_submit(step, ...)` would start an evaluation.
        """
        if self._ref is not None or not self.evaluates:
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

    def submit_validation(self, step: int, theta: Any, state: Any) -> bool:
        """Sends theta at `step` to be validated when `step` is a multiple of `validation_every` (queued behind
        the actor's other calls; never skipped).

        Args:
            step: the learner's step.
            theta: the run's result theta at `step` (`final_theta`, a numpy pytree).
            state: the learner's state at `step` (kept for a "best" checkpoint).

        Returns:
            Whether a validation was sent.
        """
        if not self.validation_every or step % self.validation_every:
            return False
        ref = self.actor.validate.remote(theta, step, self._baselines)
        self._validations.append([step, theta, state, ref, 1])
        return True

    @property
    def validations_pending(self) -> list[int]:
        """The steps whose validation was sent and has not been returned by `poll_validations`."""
        return [v[0] for v in self._validations]

    def poll_validations(self, wait_through: Optional[int] = None, timeout_s: float = 900.0) -> list[Validated]:
        """The validations finished since the last call, in the order sent.

        A validation lost because the actor died is sent again to the restarted actor (at most
        `MAX_VALIDATION_TRIES` times in all); a baseline the actor tuned is handed to later calls.

        Args:
            wait_through: wait for every validation of a step <= this one (None: wait for none).
            timeout_s: how long to wait for one validation.

        Returns:
            [Validated, ...] in step order.

        Raises:
            RuntimeError: a validation waited for did not finish within `timeout_s`, or was lost
                `MAX_VALIDATION_TRIES` times.
        """
        ray, out = self._ray, []
        while self._validations:
            step, theta, state, ref, tries = self._validations[0]
            must = wait_through is not None and step <= wait_through
            done, _ = ray.wait([ref], timeout=timeout_s if must else 0.0)
            if not done:
                if must:
                    raise RuntimeError(f"the validation of step {step} did not finish within {timeout_s:g} s")
                break
            try:
                _, metrics, tuned = ray.get(ref)
            except ray.exceptions.RayTaskError:
                raise
            except ray.exceptions.RayError as e:  # the actor died: ask the restarted one again
                self.failures += 1
                if tries >= MAX_VALIDATION_TRIES:
                    raise RuntimeError(f"the validation of step {step} was lost {tries} times (the evaluation "
                                       f"actor died: {type(e).__name__})") from e
                self._validations[0] = [step, theta, state, self.actor.validate.remote(theta, step, self._baselines),
                                        tries + 1]
                continue
            self._validations.pop(0)
            if tuned is not None:
                self._baselines = ray.put(tuned)
            out.append(Validated(step, theta, state, metrics, tuned))
        return out

    def shutdown(self) -> None:
        """Kills the actor."""
        try:
            self._ray.kill(self.actor, no_restart=True)
        except Exception:  # already gone
            pass

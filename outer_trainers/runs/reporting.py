"""Reporting an outer-training run: each step's metrics, named per estimator, to the progress
display, metrics.jsonl and TensorBoard; warnings about dropped estimates; periodic meta-evaluation;
stopping a run that has diverged.

    with Reporter(output_dir, start=s, target=n, progress="bar", totals=restored_totals) as reporter:
        for step in range(s + 1, n + 1):
            state, metrics = ...                                  # GradientLearner.update's metrics
            logged = reporter.report(step, metrics, labels=estimator_labels(ests),
                                     inner_steps=sum(e.inner_steps_per_estimate for e in ests), theta=theta)
            save_checkpoint(step, state, reporter.totals(), logged)

`report` needs no loop around it: a learner fed by remote workers reports the same way as
`outer_train`, given the labels of the estimates it applied.

Divergence: an outer step in which every estimate was dropped (non-finite, or resting on no
valid inner step) applies nothing. After `max_consecutive_dropped` such steps in a row, `report`
logs the step and raises `MetaTrainingDiverged`, naming the estimators and the fraction of their
inner steps that were non-finite. The count of such steps in a row is part of `RunTotals`, so it
survives a resume.
"""
from __future__ import annotations

import dataclasses
import logging
import time
import warnings
from typing import Any, Callable, Optional, Sequence, Union

import jax
import numpy as np

from outer_trainers.validation import check_optional_int
from outer_trainers.runs.summaries import MetricsLog, Progress

logger = logging.getLogger("outer_trainers")

DEFAULT_MAX_CONSECUTIVE_DROPPED = 20


# The key under which a step's metrics carry one dict per estimate (`GradientLearner.update` writes it).
PER_ESTIMATE = "per_estimate"


class MetaTrainingDiverged(RuntimeError):
    """Meta-training stopped: no valid estimate was applied for `max_consecutive_dropped` outer steps in a row.

    Raised by `Reporter.report` (and so by `outer_train`) after the step was logged; checkpoints
    written before it are left as they are.

    Args:
        message: what diverged and what to do.
        step: the outer step (1-based, as in metrics.jsonl) at which the run stopped.
        since: the first step of the run of steps that applied nothing.
        estimators: {label: mean fraction of its inner steps that were non-finite over the dropped steps
            this session saw (None when the estimator does not report it)} of the estimators dropped.
    """

    def __init__(self, message: str, *, step: int, since: int, estimators: dict):
        super().__init__(message)
        self.step, self.since, self.estimators = step, since, dict(estimators)


@dataclasses.dataclass(frozen=True)
class RunTotals:
    """What a run accumulates over all its sessions (stored in checkpoints, restored on resume).

    Attributes:
        elapsed_s: seconds spent training, summed over sessions.
        num_dropped_total: estimates dropped from updates so far (non-finite, or without a valid inner step).
        consecutive_dropped: the outer steps in a row, up to now, in which every estimate was dropped.
    """
    elapsed_s: float = 0.0
    num_dropped_total: int = 0
    consecutive_dropped: int = 0

    def as_meta(self) -> dict:
        """The totals as checkpoint metadata entries.

        Returns:
            {"elapsed_s": ..., "num_dropped_total": ..., ...}: one entry per field.
        """
        return dataclasses.asdict(self)

    @classmethod
    def from_meta(cls, meta: dict) -> RunTotals:
        """The totals stored in a checkpoint's metadata (zero where absent, e.g. in older checkpoints).

        Args:
            meta: a checkpoint's metadata, as written with `as_meta()` entries.

        Returns:
            A RunTotals.
        """
        return cls(float(meta.get("elapsed_s", 0.0)), int(meta.get("num_dropped_total", 0)),
                   int(meta.get("consecutive_dropped", 0)))


def _python(value: Any) -> Any:
    value = np.asarray(value)
    return value.item() if value.size == 1 else value.tolist()


def name_metrics(metrics: dict, labels: Sequence[str]) -> dict:
    """A learner's metrics as one flat dict of Python numbers, the per-estimate ones named by label.

    Args:
        metrics: `GradientLearner.update`'s metrics: combined scalars, and under PER_ESTIMATE one dict
            per estimate.
        labels: one label per estimate (see `estimator_labels`).

    Returns:
        {name: number (or list for a non-scalar)}: the combined metrics under their own names and
        metric `k` of estimate i under f"{k}/{labels[i]}".
    """
    metrics = jax.device_get(metrics)
    per_estimate = metrics.get(PER_ESTIMATE, ())
    if len(per_estimate) != len(labels):
        raise ValueError(f"{len(labels)} labels for {len(per_estimate)} estimates")
    named = {k: _python(v) for k, v in metrics.items() if k != PER_ESTIMATE}
    for label, estimate_metrics in zip(labels, per_estimate):
        named.update({f"{k}/{label}": _python(v) for k, v in estimate_metrics.items()})
    return named


class Reporter:
    """Reports the outer steps of one training session of a run.

    Every step: the progress display advances, and estimates the learner dropped (non-finite, or
    without a valid inner step) are counted and logged with their labels (the first as a
    RuntimeWarning). Every `log_every` steps, at the last step, at meta-evaluation steps, at steps
    given `extra` metrics and at a step that stops the run: the metrics (named by `name_metrics`,
    plus "inner_steps_per_s" since the last logged step, "elapsed_s" and "num_dropped_total" over
    the whole run, every `eval_every` steps `meta_evaluator(theta)`'s metrics, and the `extra`
    ones) are written to `output_dir`'s
    metrics.jsonl and TensorBoard and shown by the progress display. After
    `max_consecutive_dropped` steps in a row in which every estimate was dropped, `report` raises
    MetaTrainingDiverged. Use it as a context manager (or call `close`) so the files are closed.

    Args:
        output_dir: where metrics.jsonl and tb/ go; None writes no files.
        start: outer steps the run had taken when this session started (metrics.jsonl lines past it,
            left by a killed session, are dropped).
        target: the step this session trains to.
        progress: True or "auto" (a tqdm bar on a terminal, else plain lines every few seconds), "bar", "log"
            (plain lines on stderr, for log files), False or "none".
        log_every: log every this many steps (>= 1).
        tensorboard: also write TensorBoard event files.
        meta_evaluator: `meta_evaluator(theta) -> {name: float}` (e.g. a MetaEvaluator), or None.
        eval_every: run `meta_evaluator` every this many steps (0: never).
        totals: the run's totals before this session (from its checkpoint; zero for a new run).
        max_consecutive_dropped: stop after this many steps in a row (>= 1) that applied no estimate,
            counting those before a resume (`totals.consecutive_dropped`); None never stops.
    """

    def __init__(self, output_dir: Optional[str], *, start: int, target: int, progress: Union[bool, str] = True,
                 log_every: int = 1, tensorboard: bool = True,
                 meta_evaluator: Optional[Callable[[Any], dict]] = None, eval_every: int = 0,
                 totals: RunTotals = RunTotals(),
                 max_consecutive_dropped: Optional[int] = DEFAULT_MAX_CONSECUTIVE_DROPPED):
        if log_every < 1:
            raise ValueError(f"log_every must be >= 1, got {log_every}")
        self.max_consecutive_dropped = check_optional_int("max_consecutive_dropped", max_consecutive_dropped,
                                                          minimum=1)
        self.target, self.log_every = target, log_every
        self.meta_evaluator, self.eval_every = meta_evaluator, eval_every
        self._elapsed0, self._dropped_total = totals.elapsed_s, totals.num_dropped_total
        self._consecutive = totals.consecutive_dropped
        self._streak: dict[str, _Fractions] = {}  # label -> non-finite fractions of its dropped estimates in a row
        self._log = MetricsLog(output_dir, resume_step=start, tensorboard=tensorboard)
        self._bar = Progress({True: "auto", False: "none"}.get(progress, progress), total=max(target, start),
                             initial=start)
        self._t_start = self._t_logged = time.perf_counter()
        self._inner_steps = 0  # since the last logged step

    def report(self, step: int, metrics: dict, *, labels: Sequence[str], inner_steps: int,
               theta: Any = None, extra: Optional[dict] = None) -> Optional[dict]:
        """Reports outer step `step` (1-based: the number of steps taken after it).

        Args:
            step: outer steps taken, this one included.
            metrics: the learner's metrics of this step (`GradientLearner.update`).
            labels: one label per estimate in `metrics` (see `estimator_labels`).
            inner_steps: inner steps this outer step ran over all its estimates (for the throughput).
            theta: theta after the step, for `meta_evaluator` (needed only at evaluation steps).
            extra: metrics of this step measured by the caller (e.g. the validation selection's); a step
                with them is always logged, they join its metrics.

        Returns:
            The logged metrics as a flat dict of Python numbers, or None when this step is not logged.

        Raises:
            MetaTrainingDiverged: this step made `max_consecutive_dropped` steps in a row that applied no
                estimate (raised after the step was logged).
        """
        self._inner_steps += inner_steps
        self._count_dropped(step, metrics, labels)
        diverged = self.max_consecutive_dropped is not None and self._consecutive >= self.max_consecutive_dropped
        evaluate = self.meta_evaluator is not None and self.eval_every > 0 and step % self.eval_every == 0
        logged = None
        if step % self.log_every == 0 or step == self.target or evaluate or diverged or extra:
            now = time.perf_counter()
            logged = name_metrics(metrics, labels)
            logged["inner_steps_per_s"] = self._inner_steps / max(now - self._t_logged, 1e-9)
            logged["elapsed_s"] = self._elapsed0 + now - self._t_start
            logged["num_dropped_total"] = self._dropped_total
            self._t_logged, self._inner_steps = now, 0
            if evaluate:
                logged.update(self.meta_evaluator(theta))
            logged.update(extra or {})
            self._log.write(step, logged)
        self._bar.update(1, logged)
        if diverged:
            raise self._diverged(step)
        return logged

    def _count_dropped(self, step: int, metrics: dict, labels: Sequence[str]) -> None:
        dropped = int(metrics["num_dropped"])
        if not dropped:
            self._consecutive, self._streak = 0, {}
            return
        per_estimate = jax.device_get([{k: m[k] for k in ("dropped", "nonfinite_frac") if k in m}
                                       for m in metrics.get(PER_ESTIMATE, ())])
        which = [(label, m.get("nonfinite_frac")) for label, m in zip(labels, per_estimate)
                 if m.get("dropped", dropped == len(labels))]
        if dropped == len(labels):
            self._consecutive += 1
            for label, frac in which:
                self._streak.setdefault(label, _Fractions()).add(frac)
        else:
            self._consecutive, self._streak = 0, {}
        self._dropped_total += dropped
        names = "; ".join(f"{label} ({_Fractions().add(frac).describe()})" for label, frac in which)
        msg = (f"outer step {step}: {dropped} of {len(labels)} estimates had a non-finite meta-loss or gradient "
               f"or no valid inner step and were dropped from the update ({self._dropped_total} so far)"
               + (f": {names}" if names else ""))
        logger.warning(msg)
        if self._dropped_total == dropped:
            warnings.warn(msg, RuntimeWarning)

    def _diverged(self, step: int) -> MetaTrainingDiverged:
        since = step - self._consecutive + 1
        fractions = {label: f.mean() for label, f in self._streak.items()}
        which = "; ".join(f"{label} ({f.describe()})" for label, f in self._streak.items())
        msg = (f"meta-training diverged: every estimate was dropped in the {self._consecutive} outer steps "
               f"{since}-{step} (max_consecutive_dropped={self.max_consecutive_dropped}): {which}. Nothing was "
               f"applied in them, so theta and the outer optimizer state are those after step {since - 1}; the "
               f"checkpoints written so far are kept. Find what makes the inner steps non-finite (the task's loss "
               f"or data, e.g. empty batches, or an outer learning rate that threw theta too far; "
               f"'nonfinite_frac/<estimator>' is logged per step), or pass max_consecutive_dropped=None to keep going.")
        logger.error(msg)
        return MetaTrainingDiverged(msg, step=step, since=since, estimators=fractions)

    def totals(self) -> RunTotals:
        """The run's totals now.

        Returns:
            RunTotals: time over all sessions, dropped estimates, steps in a row that applied none.
        """
        return RunTotals(self._elapsed0 + time.perf_counter() - self._t_start, self._dropped_total, self._consecutive)

    def close(self) -> None:
        """Closes the progress display and the metrics files."""
        self._bar.close()
        self._log.close()

    def __enter__(self) -> Reporter:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


class _Fractions:
    """The mean non-finite fraction of an estimator's dropped estimates (None once one did not report it)."""

    def __init__(self):
        self.total, self.count, self.reported = 0.0, 0, True

    def add(self, fraction: Optional[float]) -> _Fractions:
        if fraction is None:
            self.reported = False
        else:
            self.total, self.count = self.total + float(fraction), self.count + 1
        return self

    def mean(self) -> Optional[float]:
        return self.total / self.count if self.reported and self.count else None

    def describe(self) -> str:
        mean = self.mean()
        if mean is None:
            return "non-finite meta-loss or gradient"
        if mean == 0:
            return "non-finite meta-loss or gradient; none of its inner steps was non-finite"
        return f"{mean:.1%} of its inner steps non-finite"

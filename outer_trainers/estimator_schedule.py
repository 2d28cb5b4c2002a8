"""EstimatorSchedule: re-sample the estimators (e.g. their task families) every N outer steps.

Meta-training on a broad task distribution draws a new static configuration now and then —
a new architecture, dataset or batch size, which changes shapes and so cannot be a jitted
per-task sample. Pass an EstimatorSchedule to `outer_train` instead of a list of estimators:

    families = tasks.FamilySchedule(every=200, seed=0)               # host-side sampled families
    def make(period):
        step = LOptTruncatedStep(families(period * 200), lo, trunc_sched)
        return [TruncatedPES(step, num_tasks=8, trunc_length=20)]
    outer_train(learner, EstimatorSchedule(200, make), num_steps=10_000)

At each outer step i with i % every == 0 (i > 0) the loop asks `make(i // every)` for new
estimators and initialises their states at the current theta with a key derived from the run's
key and i. `make` must be deterministic in its argument (cached per period here), so a resumed
run rebuilds exactly the estimators its checkpoint was written with.
"""
from __future__ import annotations

from typing import Callable, Sequence

from outer_trainers.estimators.gradient_estimator import GradientEstimator


class EstimatorSchedule:
    def __init__(self, every: int, make: Callable[[int], Sequence[GradientEstimator]]):
        if every < 1:
            raise ValueError(f"EstimatorSchedule every must be >= 1, got {every}")
        self.every = int(every)
        self.make = make
        self._cache: dict[int, list] = {}

    def period(self, outer_step: int) -> int:
        return int(outer_step) // self.every

    def resamples_at(self, outer_step: int) -> bool:
        """True when outer step `outer_step` starts a new period (and so new estimators)."""
        return outer_step > 0 and outer_step % self.every == 0

    def __call__(self, outer_step: int) -> list:
        """The estimators used at `outer_step` (built once per period)."""
        k = self.period(outer_step)
        if k not in self._cache:
            ests = list(self.make(k))
            if not ests or not all(isinstance(e, GradientEstimator) for e in ests):
                raise TypeError(f"EstimatorSchedule.make({k}) must return a non-empty list of GradientEstimators, "
                                f"got {ests!r}")
            self._cache = {k: ests}
        return self._cache[k]

    def __repr__(self) -> str:
        return f"EstimatorSchedule(every={self.every}, make={getattr(self.make, '__name__', self.make)!r})"

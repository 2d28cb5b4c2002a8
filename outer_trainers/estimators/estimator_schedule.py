"""EstimatorSchedule: new estimators (e.g. on a newly drawn task family) every N outer steps.

Meta-training on a broad task distribution draws a new static configuration now and then —
a new architecture, dataset or batch size, which changes shapes and so cannot be a jitted
per-task sample. Pass an EstimatorSchedule to `outer_train` instead of a list of estimators:

    def make(period):
        family = tasks.sample_family_for_period(seed=0, period=period)   # the same family per period
        step = LOptTruncatedStep(family, lo, trunc_sched)
        return [TruncatedPES(step, num_tasks=8, trunc_length=20)]
    outer_train(learner, EstimatorSchedule(200, make), num_steps=10_000)

Period k covers outer steps k·every … (k+1)·every − 1 and trains with `make(k)`. The run starts
with `make(0)`'s estimators (initialised with the rest of the run's state); at each later period
start (`resamples_at(i)`: i > 0 and i % every == 0) the loop builds `make(i // every)` and
initialises their states at the current theta with a key derived from the run's key and i.
`make` must be deterministic in its argument (the current period's estimators are cached; going
back to an earlier period calls `make` again), so a resumed run rebuilds exactly the estimators
its checkpoint was written with.
"""
from __future__ import annotations

from typing import Callable, Sequence

from outer_trainers.estimators.gradient_estimator import GradientEstimator
from outer_trainers.validation import check_int


class EstimatorSchedule:
    """The estimators of each period of `every` outer steps, built by `make(period)` and cached.

    Args:
        every: outer steps per period (>= 1).
        make: `make(period) -> [GradientEstimator, ...]`, deterministic in `period` (an int >= 0).
    """

    def __init__(self, every: int, make: Callable[[int], Sequence[GradientEstimator]]):
        self.every = check_int("EstimatorSchedule every", every, minimum=1)
        self.make = make
        self._cache: dict[int, list] = {}

    def period(self, outer_step: int) -> int:
        """The period an outer step belongs to: outer_step // every.

        Args:
            outer_step: the outer step, 0-based.

        Returns:
            The period k, 0-based.
        """
        return int(outer_step) // self.every

    def resamples_at(self, outer_step: int) -> bool:
        """Whether an outer step starts a new period after the first (and so needs new estimators).

        Args:
            outer_step: the outer step, 0-based.

        Returns:
            True at the multiples of `every` after 0.
        """
        return outer_step > 0 and outer_step % self.every == 0

    def __call__(self, outer_step: int) -> list:
        """The estimators used at outer step `outer_step` (built once per period)."""
        k = self.period(outer_step)
        if k not in self._cache:
            ests = list(self.make(k))
            if not ests or not all(isinstance(e, GradientEstimator) for e in ests):
                raise TypeError(f"EstimatorSchedule.make({k}) must return a non-empty list of GradientEstimators, "
                                f"got {ests!r}")
            self._cache = {k: ests}
        return self._cache[k]

    def estimators_of_state(self, steps_taken: int) -> list:
        """The estimators whose states a run holds after `steps_taken` outer steps.

        Args:
            steps_taken: outer steps the run has taken.

        Returns:
            The estimators of the last step taken (step `steps_taken - 1`), or of step 0 for a run
            that has not started.
        """
        return self(max(int(steps_taken) - 1, 0))

    def __repr__(self) -> str:
        return f"EstimatorSchedule(every={self.every}, make={getattr(self.make, '__name__', self.make)!r})"

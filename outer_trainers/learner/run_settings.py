"""The settings of a meta-training run besides what it trains, one frozen dataclass per concern.

    MetaEval(every=100, num_tasks=4)            periodic meta-evaluation of theta on held-out tasks
    Comparison(num_tasks=8, num_steps=300)      the final comparison with tuned, scheduled Adam
    Validation(every=250, suite="smoke")        theta_best: theta scored on validation tasks
    Reporting(progress="auto", log_every=10)    progress display, metrics, the divergence stop

(When checkpoints are written and kept is `runs.checkpoint_policy.CheckpointPolicy`.) Each is a
value: frozen, compared and hashed by its fields, checked when built, so a bad setting fails
before anything is built or compiled. `learner.gin_run.train` builds them from their gin bindings
(`MetaEval.every = 100`, `Reporting.progress = "log"`, ...); a script of plain Python passes them to
the steps of `learner.meta_training_run`, and `outer_train(..., reporting=Reporting(...))` takes
its Reporting. No gin here.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence, Union

from outer_trainers.evaluation.baselines.schedules import check_schedule
from outer_trainers.runs.reporting import DEFAULT_MAX_CONSECUTIVE_DROPPED
from outer_trainers.runs.summaries import PROGRESS_MODES
from outer_trainers.validation import check_int, check_optional_int
from tasks import suites

DEFAULT_ADAM_LRS = (1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1, 1.0)


def _tuple(value: Optional[Sequence[Any]]) -> Optional[tuple]:
    return None if value is None else tuple(value)


@dataclasses.dataclass(frozen=True)
class MetaEval:
    """Periodic meta-evaluation: the run's result theta trains held-out draws of tasks; "eval/" metrics.

    Attributes:
      every: outer steps between meta-evaluations (0: none).
      tasks: Tasks or TaskFamilies meta-evaluated (None: the family meta-trained on).
      num_tasks: tasks drawn per meta-evaluated family.
      num_steps: inner steps of each meta-evaluation run.
      seed: the seed of the meta-evaluation's task draws.
    """
    every: int = 0
    tasks: Optional[Sequence[Any]] = None
    num_tasks: int = 4
    num_steps: int = 100
    seed: int = 12345

    def __post_init__(self):
        object.__setattr__(self, "tasks", _tuple(self.tasks))
        if self.every < 0:
            raise ValueError(f"MetaEval.every must be >= 0 (0: no meta-evaluation), got {self.every}")
        if self.every > 0 and (self.num_tasks < 1 or self.num_steps < 1):
            raise ValueError(f"MetaEval.every = {self.every} needs MetaEval.num_tasks >= 1 and MetaEval.num_steps >= 1, "
                             f"got {self.num_tasks} and {self.num_steps}")


@dataclasses.dataclass(frozen=True)
class Comparison:
    """The comparison with tuned Adam after meta-training (comparison.md), on held-out draws of the family.

    Attributes:
      num_tasks: held-out tasks (0: no comparison).
      num_steps: inner steps of each comparison run.
      adam_lrs: Adam's (peak) learning-rate grid (extended past an edge holding the best rate).
      adam_schedule: Adam's schedule over the `num_steps` (`evaluation.baselines.schedules`): "cosine"
        (the default: linear warm-up over 5 % of the steps, then cosine decay to 0, as the field runs its
        baselines), "linear" or "constant".
    """
    num_tasks: int = 0
    num_steps: int = 200
    adam_lrs: Sequence[float] = DEFAULT_ADAM_LRS
    adam_schedule: str = "cosine"

    def __post_init__(self):
        object.__setattr__(self, "adam_lrs", tuple(float(x) for x in self.adam_lrs))
        check_schedule(self.adam_schedule, "Comparison.adam_schedule")
        if self.num_tasks < 0:
            raise ValueError(f"Comparison.num_tasks must be >= 0 (0: no comparison with Adam), got {self.num_tasks}")
        if self.num_tasks > 0 and (self.num_steps < 1 or not self.adam_lrs):
            raise ValueError(f"the comparison with Adam (Comparison.num_tasks = {self.num_tasks}) needs "
                             f"Comparison.num_steps >= 1 and at least one rate in Comparison.adam_lrs, got "
                             f"num_steps={self.num_steps}, adam_lrs={self.adam_lrs}; set them, or num_tasks = 0")


@dataclasses.dataclass(frozen=True)
class Validation:
    """Validation selection: every `every` steps the result theta is scored on validation tasks against a
    tuned baseline (`outer_trainers.ValidationSelector`), and the best so far kept as theta_best.

    To keep "best" checkpoints by it too: `CheckpointPolicy.best_metric = "valid/score"`, `best_mode = "max"`.

    Attributes:
      every: outer steps between validations (0: none).
      suite: the validation tasks as a `tasks.suites` name (e.g. "smoke", "validation-cpu").
      tasks: Tasks or TaskFamilies to validate on instead of a suite.
      num_steps: inner steps of each validation run (None: a suite task's own budget; 100 for `tasks`).
      num_seeds: seeds per validation task (None: a suite task's own seeds; 3 for `tasks`).
      baseline: the tuned baseline ("adam", "adamw", "muon" or "sgdm").
      lrs: its starting learning-rate grid, >= 7 rates (None: the protocol's default grid).
      max_extensions: the most extensions of that grid past an edge holding the best rate.
      objective: what is compared, "train" (final train loss; the baseline tuned on it) or "held_out"
        (held-out loss after training; the baseline tuned on validation loss): `ValidationSelector`.
    """
    every: int = 0
    suite: Optional[str] = None
    tasks: Optional[Sequence[Any]] = None
    num_steps: Optional[int] = None
    num_seeds: Optional[int] = None
    baseline: str = "adam"
    lrs: Optional[Sequence[float]] = None
    max_extensions: int = 4
    objective: str = "train"

    def __post_init__(self):
        object.__setattr__(self, "tasks", _tuple(self.tasks) or None)
        object.__setattr__(self, "lrs", _tuple(self.lrs))
        given = "Validation.suite" if self.suite is not None else "Validation.tasks" if self.tasks else None
        if self.every < 0:
            raise ValueError(f"Validation.every must be >= 0 (0: no validation selection), got {self.every}")
        if self.every > 0 and given is None:
            raise ValueError(f"Validation.every = {self.every} needs validation tasks: set Validation.suite (one of "
                             f"{suites.names()}, e.g. 'smoke') or Validation.tasks")
        if given is not None and self.every == 0:
            raise ValueError(f"{given} is set but Validation.every = 0, so theta would never be validated; set "
                             f"Validation.every (outer steps between validations), or remove {given}")
        if self.suite is not None and self.tasks:
            raise ValueError("set Validation.suite or Validation.tasks, not both")
        if self.objective not in ("train", "held_out"):
            raise ValueError(f"Validation.objective = {self.objective!r}; use 'train' (final train loss) or "
                             f"'held_out' (held-out loss after training, the baseline tuned on validation loss)")
        if self.suite is not None and self.suite not in suites.names():
            raise ValueError(f"Validation.suite = {self.suite!r} is not a suite; the suites are {suites.names()}")

    def selector_options(self) -> dict:
        """The arguments of `ValidationSelector` besides the learned optimizer, the tasks and the cache path."""
        return dict(num_steps=self.num_steps, num_seeds=self.num_seeds, baseline=self.baseline, lrs=self.lrs,
                    max_extensions=self.max_extensions, objective=self.objective)


@dataclasses.dataclass(frozen=True)
class Reporting:
    """What a run shows and logs while it trains, and when it gives up on a diverged run.

    `outer_train(..., reporting=Reporting(progress=False, tensorboard=False))`; in gin, `Reporting.log_every = 10`.

    Attributes:
      progress: "auto" (a tqdm bar on a terminal, else a plain line every few seconds), "bar", "log"
        (plain lines, for log files), "none"; True means "auto", False "none".
      log_every: outer steps between logged metrics (and the last step).
      tensorboard: also write TensorBoard summaries.
      max_consecutive_dropped: stop with `outer_trainers.MetaTrainingDiverged` after this many outer steps
        in a row that applied no estimate (every estimate non-finite or without a valid inner step);
        None: never.
    """
    progress: Union[bool, str] = "auto"
    log_every: int = 1
    tensorboard: bool = True
    max_consecutive_dropped: Optional[int] = DEFAULT_MAX_CONSECUTIVE_DROPPED

    def __post_init__(self):
        mode = {True: "auto", False: "none"}.get(self.progress, self.progress) \
            if isinstance(self.progress, bool) else self.progress
        if mode not in PROGRESS_MODES:
            raise ValueError(f"Reporting.progress must be True, False or one of {PROGRESS_MODES}, got {self.progress!r}")
        object.__setattr__(self, "progress", mode)
        if self.log_every < 1:
            raise ValueError(f"Reporting.log_every must be >= 1, got {self.log_every}")
        if self.max_consecutive_dropped is not None and self.max_consecutive_dropped < 1:
            raise ValueError(f"Reporting.max_consecutive_dropped must be >= 1 or None, got "
                             f"{self.max_consecutive_dropped}")
        check_int("Reporting.log_every", self.log_every, minimum=1)
        check_optional_int("Reporting.max_consecutive_dropped", self.max_consecutive_dropped, minimum=1)

    def loop_options(self) -> dict:
        """These settings as keyword arguments (of `runs.reporting.Reporter` and `ray_outer_train`).

        Returns:
          {"progress", "log_every", "tensorboard", "max_consecutive_dropped"}.
        """
        return dict(progress=self.progress, log_every=self.log_every, tensorboard=self.tensorboard,
                    max_consecutive_dropped=self.max_consecutive_dropped)

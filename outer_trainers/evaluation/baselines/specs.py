"""The spec syntax of a tuned baseline: NAME or NAME:SCHEDULE.

A baseline spec is NAME or NAME:SCHEDULE, NAME one of `tuning.baseline_names()` and SCHEDULE one of
`SCHEDULE_CHOICES`:

    adam, adam:constant     the rate constant over the budget (a bare name means what it always
                            meant: a constant rate)
    adamw:cosine            linear warm-up over 5% of the budget, then cosine decay to 0
    adamw:linear            linear warm-up, then linear decay to 0
    adamw:tuned             the schedule tuned with the rate (and the decay): constant or warm-up + cosine
                            (`BaselineTuning.tuned_schedules`), chosen on validation loss

(`schedules`). The spec is the baseline's name in the results. `scripts/evaluate.py` takes it in
`--baselines` and `--optimizer`.
"""
from __future__ import annotations

from outer_trainers.evaluation.baselines.schedules import SCHEDULES
from outer_trainers.evaluation.tuning import baseline_names

TUNED = "tuned"
SCHEDULE_CHOICES = SCHEDULES + (TUNED,)


def parse_baseline(spec: str) -> tuple[str, str]:
    """A baseline spec (module docstring) split into its baseline and its schedule.

    Args:
      spec: "NAME" or "NAME:SCHEDULE", e.g. "adam", "adamw:cosine", "muon:tuned".

    Returns:
      (NAME, SCHEDULE), SCHEDULE "constant" for a bare name.

    Raises:
      ValueError: an unknown baseline or schedule; the message lists the valid ones.
    """
    if not isinstance(spec, str):
        raise ValueError(f"a baseline spec is a string such as 'adamw:cosine', got {spec!r}")
    name, _, schedule = spec.partition(":")
    if name not in baseline_names():
        raise ValueError(f"unknown baseline {name!r} in {spec!r}; the baselines are {baseline_names()}, written "
                         f"NAME or NAME:SCHEDULE with SCHEDULE one of {list(SCHEDULE_CHOICES)}")
    if ":" in spec and schedule not in SCHEDULE_CHOICES:
        raise ValueError(f"unknown schedule {schedule!r} in baseline {spec!r}; the schedules are "
                         f"{list(SCHEDULE_CHOICES)} (e.g. {name}:cosine)")
    return name, schedule or "constant"


def is_tuned_baseline(spec: str) -> bool:
    """Whether `spec` names a tuned baseline: NAME of `tuning.baseline_names()`, alone or as NAME:ANYTHING
    (`parse_baseline` then says whether the schedule is known)."""
    return isinstance(spec, str) and spec.partition(":")[0] in baseline_names()


def baseline_specs() -> list[str]:
    """Every tuned baseline spec: each baseline bare and with each of `SCHEDULE_CHOICES`."""
    return [f"{n}{s}" for n in baseline_names() for s in [""] + [f":{c}" for c in SCHEDULE_CHOICES]]

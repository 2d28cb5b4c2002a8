"""The spec syntax of a tuned baseline: NAME or NAME:SCHEDULE.

A baseline spec is NAME or NAME:SCHEDULE, NAME one of `tuning.baseline_names()` and SCHEDULE one of
`SCHEDULE_CHOICES`:

    adam, adam:constant     the rate constant over the budget (a bare name means what it always
                            meant: a constant rate)
    adamw:cosine            linear warm-up over 5% of the budget, then cosine decay to 0
    adamw:linear            linear warm-up, then linear decay to 0
    adamw:tuned             the schedule tuned with the rate (and the decay): constant or warm-up + cosine
                            (`BaselineTuning.tuned_schedules`), chosen on validation loss

(`schedules`). A shipped optimizer's deploy rules on a baseline are a baseline too:

    rules:NAME@BASELINE     the rule chain of `lopt.pretrained` name NAME (read from its record when
                            the spec is built: `preset_rules.record_chain`) wrapped around BASELINE,
                            a spec NAME[:SCHEDULE] as above (e.g. rules:celo2_v9@adamw,
                            rules:celo2_v9@adamw:tuned); NAME-PART... leaves parts of the chain out
                            (rules:celo2_v9-growth_limited@adamw); tuned like BASELINE
                            (`preset_rules.rules_baseline`, `spec_tuning.baseline_setup`)

The spec is the baseline's name in the results. `scripts/evaluate.py` takes it in `--baselines` and
`--optimizer`.
"""
from __future__ import annotations

from outer_trainers.evaluation.baselines.preset_rules import (ALL_RULES, SCHEDULE_PART, chain_without, parse_preset,
                                                              record_chain)
from outer_trainers.evaluation.baselines.schedules import SCHEDULES
from outer_trainers.evaluation.tuning import baseline_names

TUNED = "tuned"
SCHEDULE_CHOICES = SCHEDULES + (TUNED,)
RULES = "rules:"


def parse_baseline(spec: str) -> tuple[str, str]:
    """A baseline spec (module docstring) split into its baseline and its schedule.

    Args:
      spec: "NAME" or "NAME:SCHEDULE", e.g. "adam", "adamw:cosine", "muon:tuned"; or "rules:PRESET@NAME[:SCHEDULE]".

    Returns:
      (NAME, SCHEDULE), SCHEDULE "constant" for a bare name (for a rules spec: its baseline's).

    Raises:
      ValueError: an unknown baseline or schedule, or a wrong rules spec (`parse_rules_baseline`); the
        message lists the valid ones.
    """
    if not isinstance(spec, str):
        raise ValueError(f"a baseline spec is a string such as 'adamw:cosine', got {spec!r}")
    if spec.startswith(RULES):
        return parse_rules_baseline(spec)[2:]
    name, _, schedule = spec.partition(":")
    if name not in baseline_names():
        raise ValueError(f"unknown baseline {name!r} in {spec!r}; the baselines are {baseline_names()}, written "
                         f"NAME or NAME:SCHEDULE with SCHEDULE one of {list(SCHEDULE_CHOICES)}")
    if ":" in spec and schedule not in SCHEDULE_CHOICES:
        raise ValueError(f"unknown schedule {schedule!r} in baseline {spec!r}; the schedules are "
                         f"{list(SCHEDULE_CHOICES)} (e.g. {name}:cosine)")
    return name, schedule or "constant"


def parse_rules_baseline(spec: str) -> tuple[str, tuple[str, ...], str, str]:
    """A rules spec "rules:PRESET[-PART...]@NAME[:SCHEDULE]" (module docstring) split into its parts.

    Args:
      spec: e.g. "rules:celo2_v9@adamw", "rules:celo2_v9-growth_limited@adamw:tuned".

    Returns:
      (PRESET, the parts of its chain left out, NAME, SCHEDULE).

    Raises:
      ValueError: no "@BASELINE", an unknown preset or part (`preset_rules.parse_preset`), every part left
        out (that is the baseline alone), an unknown baseline or schedule, or a SCHEDULE other than
        constant where the chain schedules the step itself.
    """
    body = spec[len(RULES):] if isinstance(spec, str) and spec.startswith(RULES) else None
    preset, at, base = (body or "").partition("@")
    if not at or not preset or not base:
        raise ValueError(f"{spec!r}: a rules spec is rules:NAME[-PART...]@BASELINE[:SCHEDULE] (NAME a "
                         f"lopt.pretrained name, BASELINE of {baseline_names()}), e.g. rules:celo2_v9@adamw")
    name, without = parse_preset(preset, spec)
    if not record_chain(name):
        raise ValueError(f"{spec!r}: {name} has no deploy rules (its record's chain is empty); rules:NAME takes a "
                         f"name with some, e.g. rules:celo2_v9@{base}")
    if ALL_RULES in without or not chain_without(record_chain(name), without):
        raise ValueError(f"{spec!r} leaves out every rule of {name}: that is the baseline {base!r} alone; name it so")
    try:
        base_name, schedule = parse_baseline(base)
    except ValueError as e:
        raise ValueError(f"{spec!r}: its baseline: {e}") from None
    chain = chain_without(record_chain(name), without)
    if schedule != "constant" and any(r["part"] == SCHEDULE_PART for r in chain):
        raise ValueError(f"{spec!r}: {name}'s chain schedules the step over the horizon ({SCHEDULE_PART!r}); a "
                         f"second schedule would multiply it: write rules:{preset}@{base_name}")
    return name, without, base_name, schedule


def is_tuned_baseline(spec: str) -> bool:
    """Whether `spec` names a tuned baseline: NAME of `tuning.baseline_names()`, alone or as NAME:ANYTHING,
    or a rules spec "rules:..." (`parse_baseline` then says whether it is well formed)."""
    return isinstance(spec, str) and (spec.partition(":")[0] in baseline_names() or spec.startswith(RULES))


def baseline_specs() -> list[str]:
    """Every tuned baseline spec: each baseline bare and with each of `SCHEDULE_CHOICES`."""
    return [f"{n}{s}" for n in baseline_names() for s in [""] + [f":{c}" for c in SCHEDULE_CHOICES]]

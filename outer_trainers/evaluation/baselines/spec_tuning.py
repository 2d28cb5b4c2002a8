"""How `suite_runs.evaluate` tunes a baseline spec on one task: `BaselineTuning` and `tune_spec`.

    tuning = BaselineTuning()                                   # the protocol's defaults
    runs = tune_spec(family, "adamw:tuned", tuning, num_steps, cfgs, keys, eval_split="test")

A baseline spec (`specs.parse_baseline`: "adam", "adamw:cosine", "muon:tuned", ...) names a
baseline and its schedule; `tune_spec` tunes it by `grid_search.tune_baseline`'s two-stage rule over

    rates      its starting grid (`BaselineTuning.grids()`: 7 log-spaced rates, extended at the edges)
    decays     AdamW's and Muon's weight-decay grid (`BaselineTuning.weight_decays(name)`: 0 and the
               decades 1e-3 .. 1, extended at the high edge); Adam and SGD with momentum: none
    schedules  the spec's one schedule, or `tuned_schedules` (constant and warm-up + cosine) for NAME:tuned

with the schedules' warm-up over `warmup_fraction` of the task's step budget (`schedules`). The same
rule (`top_k`, `stage1_seeds`) serves every baseline; `top_k=None` trains every seed at every point.
A rules spec "rules:PRESET@NAME[:SCHEDULE]" is tuned as NAME[:SCHEDULE] is, inside the preset's rule
chain (`preset_rules.rules_baseline`), except that with a weight-decay rule in the chain NAME's own
decay is 0 and not tuned (the rule is its decay): `baseline_setup`.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

import jax

from outer_trainers.evaluation.baselines.grid_search import STAGE1_SEEDS, TOP_K, check_grid, tune_baseline
from outer_trainers.evaluation.baselines.preset_rules import chain_without, has_decay_rule, record_chain, rules_baseline
from outer_trainers.evaluation.baselines.specs import RULES, TUNED, parse_baseline, parse_rules_baseline
from outer_trainers.evaluation.baselines.schedules import WARMUP_FRACTION, scheduled_baseline, warmup_steps
from outer_trainers.evaluation.task_trainer import MakeTx
from outer_trainers.evaluation.tuning import DEFAULT_WEIGHT_DECAYS, default_lrs
from tasks.base import TaskFamily

TUNED_SCHEDULES = ("constant", "cosine")


@dataclasses.dataclass(frozen=True)
class BaselineTuning:
    """How `evaluate` tunes each baseline per task (the protocol of `outer_trainers.evaluation.protocol`).

    Every baseline trains at each point of its starting grid (rate x weight decay x schedule) by the
    two-stage rule of `grid_search` (`stage1_seeds` seeds over the whole grid, every seed at the `top_k` best
    points); the grid is extended by 2 values past an edge holding the best point, at most
    `max_extensions` times. The values are checked by `evaluate` before any work (`task_plan.check_arguments`).

    Attributes:
      adam_lrs: Adam's starting learning-rate grid (default: 7 log-spaced rates, 1e-4 .. 1e-1).
      adamw_lrs: AdamW's starting grid (1e-4 .. 1e-1).
      muon_lrs: Muon's starting grid (1e-3 .. 1).
      sgdm_lrs: SGD-with-momentum's starting grid (1e-3 .. 1).
      momentum: SGD's momentum, in [0, 1).
      weight_decay: None (the default: AdamW's decay is tuned over `adamw_weight_decays`), or AdamW's
        one fixed decoupled weight decay (multiplied by the rate, as optax does), the protocol before
        decays were tuned (1e-2).
      max_extensions: the most extensions of a baseline's grid past its edge (>= 0).
      adamw_weight_decays: AdamW's starting decay grid (`tuning.DEFAULT_WEIGHT_DECAYS`: 0, 1e-3 .. 1).
      muon_weight_decays: Muon's starting decay grid (the same), on its Muon path.
      tuned_schedules: the schedules a NAME:tuned spec chooses among (constant, warm-up + cosine).
      warmup_fraction: the warm-up fraction of the scheduled baselines, in [0, 1) (5%).
      top_k: the points of stage 1 that every seed trains at (>= 1), or None: the full grid on every seed.
      stage1_seeds: the seeds of stage 1 (>= 1).
    """
    adam_lrs: Sequence[float] = default_lrs("adam")
    adamw_lrs: Sequence[float] = default_lrs("adamw")
    muon_lrs: Sequence[float] = default_lrs("muon")
    sgdm_lrs: Sequence[float] = default_lrs("sgdm")
    momentum: float = 0.9
    weight_decay: Optional[float] = None
    max_extensions: int = 4
    adamw_weight_decays: Sequence[float] = DEFAULT_WEIGHT_DECAYS
    muon_weight_decays: Sequence[float] = DEFAULT_WEIGHT_DECAYS
    tuned_schedules: Sequence[str] = TUNED_SCHEDULES
    warmup_fraction: float = WARMUP_FRACTION
    top_k: Optional[int] = TOP_K
    stage1_seeds: int = STAGE1_SEEDS

    def __post_init__(self):
        for name in ("adam_lrs", "adamw_lrs", "muon_lrs", "sgdm_lrs", "adamw_weight_decays", "muon_weight_decays",
                     "tuned_schedules"):
            object.__setattr__(self, name, tuple(getattr(self, name)))

    def grids(self) -> dict:
        """The starting rate grids by baseline name.

        Returns:
          {"adam": adam_lrs, "adamw": adamw_lrs, "muon": muon_lrs, "sgdm": sgdm_lrs}.
        """
        return {"adam": self.adam_lrs, "adamw": self.adamw_lrs, "muon": self.muon_lrs, "sgdm": self.sgdm_lrs}

    def weight_decays(self, name: str) -> tuple[float, ...]:
        """The starting decay grid of baseline `name`: AdamW's (or its fixed `weight_decay`), Muon's, else (0,)."""
        if name == "adamw":
            return (float(self.weight_decay),) if self.weight_decay is not None else self.adamw_weight_decays
        return self.muon_weight_decays if name == "muon" else (0.0,)

    def schedules(self, schedule: str) -> tuple[str, ...]:
        """The schedules a spec's SCHEDULE tries: `tuned_schedules` for "tuned", else itself."""
        return self.tuned_schedules if schedule == TUNED else (schedule,)

    def check(self) -> None:
        """ValueError naming the first wrong setting (grids, momentum, warm-up, the two-stage rule)."""
        for name, lrs in self.grids().items():
            check_grid(lrs, self.weight_decays(name), self.tuned_schedules, f"evaluate: {name}_lrs, "
                       f"{name} weight decays or tuned_schedules")
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"evaluate: momentum must be in [0, 1), got {self.momentum!r}")
        warmup_steps(1, self.warmup_fraction)
        if self.top_k is not None and (isinstance(self.top_k, bool) or not isinstance(self.top_k, int)
                                       or self.top_k < 1):
            raise ValueError(f"evaluate: BaselineTuning.top_k must be an integer >= 1 or None, got {self.top_k!r}")
        if isinstance(self.stage1_seeds, bool) or not isinstance(self.stage1_seeds, int) or self.stage1_seeds < 1:
            raise ValueError(f"evaluate: BaselineTuning.stage1_seeds must be an integer >= 1, got {self.stage1_seeds!r}")

    def describe(self) -> dict:
        """The settings as results.json's protocol entry states them (JSON-safe)."""
        return {"weight_decays": {n: list(self.weight_decays(n)) for n in ("adamw", "muon")},
                "tuned_schedules": list(self.tuned_schedules), "warmup_fraction": self.warmup_fraction,
                "two_stage": (f"stage 1: the first {self.stage1_seeds} seed(s) over the whole grid (rate x weight "
                              f"decay x schedule, extended at its edges); stage 2: every seed at the {self.top_k} "
                              f"best points of stage 1" if self.top_k is not None else "off: every seed at every point")}


def tune_spec(family: TaskFamily, spec: str, tuning: BaselineTuning, num_steps: int, cfgs: Any, keys: jax.Array,
              *, label: Optional[str] = None, **trainer_kwargs) -> list[dict]:
    """Tunes baseline spec `spec` on one task by `tuning`'s rule (module docstring).

    Args:
      family: the task family `cfgs` were drawn from.
      spec: a baseline spec ("adam", "adamw:cosine", "muon:tuned", ...).
      tuning: the grids and the rule.
      num_steps: training steps per run, the schedules' budget.
      cfgs: S task cfgs.
      keys: S run keys.
      label: the runs' optimizer name (default `spec`).
      **trainer_kwargs: `grid_search.tune_baseline`'s eval_split, sequential, valid_split, valid_points,
        select_by.

    Returns:
      `grid_search.tune_baseline`'s runs.
    """
    name, _ = parse_baseline(spec)
    make_tx, weight_decays, schedules = baseline_setup(spec, tuning, num_steps)
    return tune_baseline(family, label or spec, make_tx, num_steps, cfgs, keys, lrs=tuning.grids()[name],
                         weight_decays=weight_decays, schedules=schedules,
                         top_k=tuning.top_k, stage1_seeds=tuning.stage1_seeds, max_extensions=tuning.max_extensions,
                         **trainer_kwargs)


def baseline_setup(spec: str, tuning: BaselineTuning, num_steps: int) -> tuple[MakeTx, tuple, tuple]:
    """What tuning a baseline spec trains: its transform and its decay and schedule grids.

    Args:
      spec: a baseline spec (`specs.parse_baseline`), a rules spec included.
      tuning: the grids and settings.
      num_steps: T, the schedules' budget (and a rule chain's horizon).

    Returns:
      (make_tx: {"learning_rate", "weight_decay", "schedule"} -> optax transform, the starting decays, the
      schedules): `schedules.scheduled_baseline`'s transform with `tuning.weight_decays(NAME)`; for a rules
      spec `preset_rules.rules_baseline`'s, its decays (0.0,) when the chain holds a weight-decay rule.
    """
    name, schedule = parse_baseline(spec)
    if not spec.startswith(RULES):
        make_tx = scheduled_baseline(name, num_steps, momentum=tuning.momentum,
                                     warmup_fraction=tuning.warmup_fraction)
        return make_tx, tuning.weight_decays(name), tuning.schedules(schedule)
    preset, without, _, _ = parse_rules_baseline(spec)
    chain = chain_without(record_chain(preset), without)
    make_tx = rules_baseline(chain, name, num_steps, momentum=tuning.momentum, warmup_fraction=tuning.warmup_fraction)
    decays = (0.0,) if has_decay_rule(chain) else tuning.weight_decays(name)
    return make_tx, decays, tuning.schedules(schedule)

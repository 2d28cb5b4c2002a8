"""The baselines as the field runs them: scheduled over the task's step budget, rate, weight decay and
schedule tuned on validation loss.

- `schedules`: constant, linear warm-up + cosine to 0, linear warm-up + linear decay to 0 (optax's
  schedules, `lr_schedule`), and the baselines on them (`scheduled_baseline`);
- `specs`: the spec syntax NAME[:SCHEDULE] of `--baselines` and `--optimizer` (`parse_baseline`);
- `grid_search`: rate x weight decay x schedule tuned by the two-stage rule (`tune_baseline`);
- `spec_tuning`: how `evaluate` tunes a spec (`BaselineTuning`, `tune_spec`, `baseline_setup`);
- `preset_rules`: a shipped optimizer's rule chain read from its record, parts left out, and on a
  baseline (`record_chain`, `rules_baseline`): the spec rules:NAME@BASELINE.
"""
from outer_trainers.evaluation.baselines.grid_search import STAGE1_SEEDS, TOP_K, check_grid, tune_baseline
from outer_trainers.evaluation.baselines.preset_rules import (ALL_RULES, apply_to_baseline, chain_without,
                                                              parse_preset, record_chain, rules_baseline)
from outer_trainers.evaluation.baselines.schedules import (SCHEDULES, WARMUP_FRACTION, baseline_transform,
                                                           check_schedule, lr_schedule, schedule_index,
                                                           scheduled_baseline, scheduled_rate, unit_schedule,
                                                           warmup_steps)
from outer_trainers.evaluation.baselines.spec_tuning import TUNED_SCHEDULES, BaselineTuning, baseline_setup, tune_spec
from outer_trainers.evaluation.baselines.specs import (RULES, SCHEDULE_CHOICES, TUNED, baseline_specs,
                                                       is_tuned_baseline, parse_baseline, parse_rules_baseline)

__all__ = ["SCHEDULES", "WARMUP_FRACTION", "check_schedule", "lr_schedule", "unit_schedule", "schedule_index",
           "scheduled_rate", "scheduled_baseline", "warmup_steps", "SCHEDULE_CHOICES", "TUNED", "parse_baseline",
           "is_tuned_baseline", "baseline_specs", "TOP_K", "STAGE1_SEEDS", "check_grid", "tune_baseline",
           "TUNED_SCHEDULES", "BaselineTuning", "tune_spec", "baseline_setup", "baseline_transform", "RULES",
           "parse_rules_baseline", "ALL_RULES", "record_chain", "parse_preset", "chain_without", "apply_to_baseline",
           "rules_baseline"]

"""Evaluating optimizers: task trainers, tuned baselines, the evaluation protocol, and its reports.

One concept per module:

- `task_trainer`: many sampled tasks trained with one optimizer in one jitted program
  (`make_task_trainer`), the task draws, `run_settings` and `run_fixed`;
- `tuning`: the baselines (Adam, AdamW, Muon, SGD with momentum), their learning-rate and weight-decay
  grids and the tuning rule (`best_runs`, `tune_learning_rate`);
- `baselines`: the baselines as the field runs them: rate schedules over a task's step budget
  (`schedules`: constant, warm-up + cosine, warm-up + linear decay; `scheduled_baseline`), the spec
  syntax NAME[:SCHEDULE] (`specs`), rate x weight decay x schedule tuned by the two-stage rule
  (`grid_search.tune_baseline`) and how `evaluate` tunes a spec (`spec_tuning`: `BaselineTuning`);
- `scores`: an optimizer's runs scored against a tuned baseline's on one task (`compare_runs`: test
  loss first, VeLOdrome on held-out loss, `collapsed`, `stability`);
- `wall_clock`: time to reach tuned AdamW's final validation loss in seconds (`step_seconds`,
  `time_to_target`);
- `aggregate`: across tasks: `iqm`, its stratified-bootstrap interval (`iqm_interval`), `summarize`,
  `performance_profile`;
- `protocol`: the evaluation protocol's statement, re-exporting the functions of the three above;
- `comparison`: a learned optimizer against tuned Adam on held-out draws (`compare_optimizers`,
  the report of `scripts/outer_train.py`);
- `optimizer_specs`: what an optimizer spec names (a baseline spec NAME[:SCHEDULE], pretrained:NAME, a
  theta or checkpoint file), loaded and run;
- `task_plan`: an evaluation's arguments checked and its tasks built before any work (`plan_tasks`:
  the tasks of a suite or a task list, also for meta-training's validation selection);
- `suite_runs`: `evaluate`, the whole evaluation on a suite or a task list, and its five files;
  `BaselineTuning`, how it tunes the baselines;
- `report`, `curves`: the Markdown, JSON and CSV results, and the plots (curves, performance profile);
- `stress_test`: the stability check past the meta-training horizon.

`scripts/evaluate.py` is the command line of `evaluate` and `stress_test`.
"""
from outer_trainers.evaluation import protocol
from outer_trainers.evaluation.baselines import (SCHEDULE_CHOICES, SCHEDULES, TUNED_SCHEDULES, WARMUP_FRACTION,
                                                 BaselineTuning, baseline_specs, lr_schedule, parse_baseline,
                                                 schedule_index, scheduled_baseline, scheduled_rate, tune_baseline,
                                                 tune_spec, unit_schedule, warmup_steps)
from outer_trainers.evaluation.aggregate import iqm, iqm_interval, performance_profile, summarize
from outer_trainers.evaluation.comparison import compare_optimizers, format_comparison
from outer_trainers.evaluation.curves import plot_curves, plot_performance_profile, save_curves
from outer_trainers.evaluation.optimizer_specs import optimizer_labels, resolve_optimizer, run_learned
from outer_trainers.evaluation.report import (comparison_tables, format_number, json_safe, lr_label, markdown_table,
                                              profile_table, results_json, results_markdown, time_to_target_table,
                                              write_csv, write_json, write_text)
from outer_trainers.evaluation.scores import (collapsed, compare_runs, diverged, final_loss, first_reach,
                                              held_out_exploded, loss_ratio, smoothed, stability, steps_to_reach,
                                              trivial_loss_of, valid_steps_to_reach)
from outer_trainers.evaluation.stress_test import STRESS_FILES, stress_test
from outer_trainers.evaluation.suite_runs import (DEFAULT_BASELINES, RESULT_FILES, evaluate, run_task,
                                                  runs_in_sequence, target_baseline, target_times, trivial_losses)
from outer_trainers.evaluation.task_plan import PlannedTask, check_arguments, plan_tasks
from outer_trainers.evaluation.task_trainer import (VALID_SPLIT, make_task_trainer, run_fixed, run_settings,
                                                    sample_cfgs, task_draws, valid_schedule)
from outer_trainers.evaluation.tuning import (DEFAULT_WEIGHT_DECAYS, baseline, baseline_names, best_runs,
                                              check_learning_rates, default_lrs, default_weight_decays, grid_edge,
                                              lr_grid, muon_dimension_numbers, tune_learning_rate)
from outer_trainers.evaluation.wall_clock import step_seconds, time_to_target

__all__ = [
    # task_trainer
    "make_task_trainer", "sample_cfgs", "task_draws", "run_settings", "run_fixed", "VALID_SPLIT", "valid_schedule",
    # tuning
    "baseline", "baseline_names", "default_lrs", "check_learning_rates", "lr_grid", "best_runs", "grid_edge",
    "tune_learning_rate", "muon_dimension_numbers", "scheduled_baseline", "default_weight_decays",
    "DEFAULT_WEIGHT_DECAYS",
    # schedules, grid_search, baseline_tuning
    "SCHEDULES", "WARMUP_FRACTION", "lr_schedule", "unit_schedule", "scheduled_rate", "schedule_index",
    "warmup_steps", "tune_baseline", "BaselineTuning", "tune_spec", "TUNED_SCHEDULES",
    # scores
    "final_loss", "smoothed", "loss_ratio", "first_reach", "steps_to_reach", "diverged", "trivial_loss_of",
    "collapsed", "held_out_exploded", "stability", "compare_runs", "valid_steps_to_reach",
    # wall_clock
    "step_seconds", "time_to_target",
    # aggregate
    "iqm", "iqm_interval", "summarize", "performance_profile",
    # the protocol's module, comparison
    "protocol", "compare_optimizers", "format_comparison",
    # evaluating optimizers on suites
    "resolve_optimizer", "optimizer_labels", "run_learned", "parse_baseline", "baseline_specs", "SCHEDULE_CHOICES", "PlannedTask", "check_arguments", "plan_tasks",
    "run_task", "runs_in_sequence", "trivial_losses", "target_times", "target_baseline", "evaluate", "RESULT_FILES", "DEFAULT_BASELINES",
    "stress_test",
    "STRESS_FILES",
    # reports
    "format_number", "lr_label", "markdown_table", "comparison_tables", "results_markdown", "json_safe",
    "profile_table", "time_to_target_table", "results_json", "write_json", "write_text", "write_csv", "plot_curves", "save_curves",
    "plot_performance_profile",
]

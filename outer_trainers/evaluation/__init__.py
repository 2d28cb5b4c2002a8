"""Evaluating optimizers: task trainers, learning-rate grids, and the evaluation protocol.

`comparison` (a learned optimizer against a tuned baseline on sampled tasks), `protocol` (the
fixed-suite protocol: baselines tuned per task, wins, IQMs, speedups, stability).
"""
from outer_trainers.evaluation.comparison import compare_optimizers, format_comparison
from outer_trainers.evaluation.task_trainer import make_task_trainer, run_settings
from outer_trainers.evaluation.tuning import best_runs, lr_grid
from outer_trainers.evaluation import protocol

__all__ = ["best_runs", "compare_optimizers", "format_comparison", "lr_grid", "make_task_trainer", "run_settings",
           "protocol"]

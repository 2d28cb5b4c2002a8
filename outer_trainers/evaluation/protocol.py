"""The evaluation protocol: baselines tuned per task, and how an optimizer is scored against them.

Baselines (`tuning.baseline`): Adam, AdamW (weight decay 1e-2), Muon (optax.contrib.muon: weight
matrices and conv kernels orthogonalised, embeddings and vectors by Adam; `tuning`'s docstring) and
SGD with momentum 0.9, each with one tuned learning rate.

Tuning (`tuning`: `tune_learning_rate`, `best_runs`, `grid_edge`). A baseline is trained at every
learning rate of a log-spaced grid for every seed, all A rates x S seeds in one vmapped, jitted
program. The best rate is `best_runs`'s: the lowest median over seeds of the final train loss (a
rate with a diverged seed loses). While the best rate is the grid's smallest or largest,
`extend_by` more rates are added past that edge at the grid's spacing (at most `max_extensions`
times); a best rate still on an edge after that is reported (`grid_edge`). Test data never enters
tuning. An optimizer that is not tuned (a learned one) runs once per seed (`run_fixed`).

Scores of an optimizer against a tuned baseline (`scores.compare_runs`): final train and held-out
loss ratios, time to reach, speedup and VeLOdrome, each a median over seeds; the formulas are in
`scores`' module docstring, with the rule for diverged runs.

Across tasks (`aggregate.summarize`): wins per metric (lower final train loss, lower held-out loss,
speedup > 1), the interquartile mean (`iqm`) of each ratio, of the speedups and of the VeLOdrome ratios, each with a
95% stratified-bootstrap interval (`iqm_interval`: seeds resampled within each task,
scipy.stats.bootstrap, percentile method, 2000 resamples), the diverged and collapsed tasks; and
every optimizer's performance profile (`performance_profile`: on each task, its final train loss
over the best optimizer's). `stability` checks one long run of a learned optimizer past its
meta-training horizon (finite, below its start, not collapsed).

This module is the protocol's public face: its functions live in `tuning`, `scores`, `aggregate`
and `task_trainer` (`run_fixed`) and are re-exported here, as `outer_trainers.evaluation` does too.
"""
from outer_trainers.evaluation.aggregate import iqm, iqm_interval, performance_profile, summarize
from outer_trainers.evaluation.scores import (collapsed, compare_runs, diverged, final_loss, smoothed, stability,
                                              steps_to_reach, trivial_loss_of)
from outer_trainers.evaluation.task_trainer import run_fixed
from outer_trainers.evaluation.tuning import (baseline, baseline_names, best_runs, default_lrs, grid_edge,
                                              muon_dimension_numbers, tune_learning_rate)

__all__ = ["baseline", "baseline_names", "default_lrs", "muon_dimension_numbers", "tune_learning_rate", "run_fixed",
           "best_runs", "grid_edge", "final_loss", "smoothed", "steps_to_reach", "diverged", "collapsed",
           "trivial_loss_of", "stability", "compare_runs", "iqm", "iqm_interval", "summarize", "performance_profile"]

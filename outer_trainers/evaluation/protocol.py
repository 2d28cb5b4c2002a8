"""The evaluation protocol: baselines tuned per task on validation loss, scored on test loss.

Splits. Every run trains on the task's "train" split and measures, in the same jitted program
(`task_trainer.make_task_trainer`), its validation loss on "inner_valid" (`task_trainer.VALID_SPLIT`:
the split a user tunes on, disjoint from train and test and not the "outer_valid" split
meta-training may read) at 20 evenly spaced steps, the last at the end of training, and its test
loss on the task's eval split ("test" for every suite task) after training, with the test accuracy
of an image classifier. A task without data (a quadratic) has one objective: its validation and test
losses are that objective at the final parameters.

Baselines (`baselines.scheduled_baseline`), as the field runs them: Adam, AdamW, Muon (optax.contrib.muon:
weight matrices and conv kernels orthogonalised, embeddings and vectors by Adam; `tuning`'s docstring)
and SGD with momentum 0.9, each named by a spec NAME[:SCHEDULE] (`baselines.parse_baseline`):
its rate constant (a bare name), on linear warm-up (5% of the task's step budget) + cosine or linear
decay to 0 over that budget (`baselines.schedules`: optax's schedules), or with the schedule itself tuned
(NAME:tuned: constant or warm-up + cosine). AdamW and Muon tune their weight decay too (0 and the
decades 1e-3 .. 1). The default baselines of `evaluate` are adamw:tuned, muon:tuned, sgdm:tuned and
constant-rate adam as the reference row of the earlier protocol.

Tuning (`baselines.tune_baseline`, `best_runs`, `grid_edge`), the same rule for every baseline: stage 1
trains one seed at every point of rate x weight decay x schedule, in one vmapped, jitted program,
extending the grid along an axis while the best point lies on its edge (`extend_by` values past it at
the grid's spacing, at most `max_extensions` times; a best point still on an edge is reported by
`grid_edge`); stage 2 trains every seed at the 3 best points of stage 1, and the best is `best_runs`'s:
the lowest median over seeds of the final validation loss (a point with a diverged seed loses). Test
data never enters tuning. `tune_learning_rate` is the earlier rate-only rule (every seed at every rate,
constant rate), kept for meta-training's validation selection. An optimizer that is not tuned (a
learned one) runs once per seed (`run_fixed`).

Scores of an optimizer against a tuned baseline (`scores.compare_runs`): the headline is the test
loss at the end of training (its ratio to the baseline's, and the test accuracy for classifiers);
the validation loss, the final train loss ratio, time to reach and speedup (on train loss) come
second; VeLOdrome is measured on held-out loss (the baseline's validation curve reaching the
optimizer's final validation loss); each a median over seeds. The formulas are in `scores`' module
docstring, with the rule for diverged runs and the time to target in wall-clock (`wall_clock`: the
seconds each optimizer needs to reach tuned AdamW's final validation loss, its step time measured).

Across tasks (`aggregate.summarize`): wins per metric (lower test loss: the headline; lower final
train loss, speedup > 1), the interquartile mean (`iqm`) of each ratio, of the speedups and of the
VeLOdrome ratios, each with a 95% stratified-bootstrap interval (`iqm_interval`: seeds resampled
within each task, scipy.stats.bootstrap, percentile method, 2000 resamples), the diverged and
collapsed tasks; and every optimizer's performance profile (`performance_profile`: on each task,
its test loss over the best optimizer's). `stability` checks one long run of a learned optimizer
past its meta-training horizon (finite, below its start, not collapsed).

This module is the protocol's public face: its functions live in `tuning`, `scores`, `aggregate`,
`wall_clock` and `task_trainer` (`run_fixed`) and are re-exported here, as `outer_trainers.evaluation` does too.
"""
from outer_trainers.evaluation.aggregate import iqm, iqm_interval, performance_profile, summarize
from outer_trainers.evaluation.scores import (collapsed, compare_runs, diverged, final_loss, smoothed, stability,
                                              steps_to_reach, trivial_loss_of, valid_steps_to_reach)
from outer_trainers.evaluation.baselines import scheduled_baseline, tune_baseline
from outer_trainers.evaluation.task_trainer import VALID_SPLIT, run_fixed, valid_schedule
from outer_trainers.evaluation.tuning import (baseline, baseline_names, best_runs, default_lrs, grid_edge,
                                              muon_dimension_numbers, tune_learning_rate)
from outer_trainers.evaluation.wall_clock import step_seconds, time_to_target

__all__ = ["baseline", "baseline_names", "default_lrs", "muon_dimension_numbers", "tune_learning_rate", "run_fixed",
           "scheduled_baseline", "tune_baseline",
           "best_runs", "grid_edge", "final_loss", "smoothed", "steps_to_reach", "diverged", "collapsed",
           "trivial_loss_of", "stability", "compare_runs", "iqm", "iqm_interval", "summarize", "performance_profile",
           "VALID_SPLIT", "valid_schedule", "valid_steps_to_reach", "step_seconds", "time_to_target"]

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

Scores of an optimizer L against a tuned baseline B on one task of T steps (`scores`:
`compare_runs`), every statistic a median over seeds::

    final train loss   f = mean train loss over the last w = max(1, T // 10) steps (`final_loss`)
    held-out loss      e = mean loss over batches of the task's eval split after training
    ratios             f_L / f_B  and  e_L / e_B                  (< 1: L is better)
    smoothed curve     c(t) = mean of the train losses of steps t-w+1 .. t, for t >= w (1-based)
    time to reach      t_L = the first step t with median_seeds c_L(t) <= f_B  (the baseline's final loss)
    speedup            T / t_L  when L reaches f_B within T steps;  otherwise t_B / T, where t_B is the
                       first step at which the baseline's curve reaches f_L (so speedup < 1 means L is slower)
    VeLOdrome          v_B / T, v_B the first step at which the baseline's curve reaches f_L; inf ("> budget")
                       when it does not within T steps (against tuned Adam: VeLO's VeLOdrome metric)
    collapsed          f_L >= 0.95 x the task's trivial loss (an optional `trivial_loss` of the Task: the loss
                       of predicting the mean output, say); without one, f_L >= the initial loss

The curve is the same trailing mean that defines the final loss, so c_B(T) = f_B and a single lucky
minibatch cannot "reach" a target. A run with a non-finite train or held-out loss on any seed is
diverged: a diverged L scores ratio inf, speedup 0 and VeLOdrome 0 (and is reported as diverged, not
as a number); a baseline whose every rate diverged scores ratio 0 and speedup and VeLOdrome inf for L.

Across tasks (`aggregate.summarize`): wins per metric (f_L < f_B, e_L < e_B, speedup > 1), the
interquartile mean (`iqm`) of each ratio, of the speedups and of the VeLOdrome ratios, each with a
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

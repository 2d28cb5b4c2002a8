"""The evaluation protocol: baselines tuned per task, and how an optimizer is scored against them.

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

The curve is the same trailing mean that defines the final loss, so c_B(T) = f_B and a single lucky
minibatch cannot "reach" a target. A run with a non-finite train or held-out loss on any seed is
diverged: a diverged L scores ratio inf and speedup 0 (and is reported as diverged, not as a
number); a baseline whose every rate diverged scores ratio 0 and speedup inf for L.

Across tasks (`summarize`): wins per metric (f_L < f_B, e_L < e_B, speedup > 1) and the
interquartile mean (`iqm`) of each ratio and of the speedups. `stability` checks one long run of a
learned optimizer past its meta-training horizon.

This module is the protocol's public face: its functions live in `tuning`, `scores` and
`task_trainer` (`run_fixed`) and are re-exported here, as `outer_trainers.evaluation` does too.
"""
from outer_trainers.evaluation.scores import (compare_runs, diverged, final_loss, iqm, smoothed, stability,
                                              steps_to_reach, summarize)
from outer_trainers.evaluation.task_trainer import run_fixed
from outer_trainers.evaluation.tuning import (baseline, baseline_names, best_runs, default_lrs, grid_edge,
                                              tune_learning_rate)

__all__ = ["baseline", "baseline_names", "default_lrs", "tune_learning_rate", "run_fixed", "best_runs", "grid_edge",
           "final_loss", "smoothed", "steps_to_reach", "diverged", "stability", "compare_runs", "iqm", "summarize"]

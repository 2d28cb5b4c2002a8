"""A learned optimizer against Adam tuned by the evaluation protocol, on held-out draws of a task family.

    results = compare_optimizers(family, lo.opt_fn, theta, num_tasks=8, num_steps=500, key=key,
                                 adam_schedule="cosine")
    print(format_comparison(results, 500))

is the report `scripts/outer_train.py` prints at the end of a run: both optimizers train the
same task draws; Adam is tuned over its learning-rate grid (`tuning.tune_learning_rate`, the grid
extended past an edge holding the best rate) and the learned optimizer is scored against the best
Adam by `scores.compare_runs` (final-loss ratio, time to reach, speedup), the draws standing in
for the seeds of `outer_trainers.evaluation.protocol`. Adam's rate follows one of the baselines'
schedules over the same step budget (`baselines.schedules`: constant, or linear warm-up over 5 % of
the steps then cosine or linear decay to 0); the grid is over its peak rate.
"""
from __future__ import annotations

from typing import Any, Sequence

import jax
import numpy as np
import optax

from outer_trainers.evaluation.baselines.schedules import WARMUP_FRACTION, check_schedule, lr_schedule, warmup_steps
from outer_trainers.evaluation.scores import compare_runs, final_loss
from outer_trainers.evaluation.task_trainer import MakeTx, run_fixed, sample_cfgs
from outer_trainers.evaluation.tuning import best_runs, check_learning_rates, grid_edge, tune_learning_rate
from tasks.base import TaskFamily, check_count


def compare_optimizers(family: TaskFamily, learned_tx: MakeTx, theta: Any, *, num_tasks: int, num_steps: int,
                       key: jax.Array, adam_lrs: Sequence[float] = (1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1, 1.0),
                       eval_split: str = "test", max_extensions: int = 4, min_grid_points: int = 7,
                       adam_schedule: str = "constant", warmup_fraction: float = WARMUP_FRACTION) -> dict:
    """The learned optimizer vs Adam tuned by the evaluation protocol, on held-out task draws of `family`.

    `outer_trainers.evaluation.protocol`'s rules with the `num_tasks` draws as the seeds: both train the same
    draws and initialisations; Adam runs every rate of its grid on every draw (one program), the
    best rate is `best_runs`'s (lowest median over draws of the final validation loss, on the
    draws' "inner_valid" split; a diverged draw loses),
    and the grid is extended past an edge holding the best rate. A grid of fewer than
    `min_grid_points` rates is first replaced by that many log-spaced rates spanning it (a decade
    either side of a single rate). Adam's step at count t is `lr_schedule(adam_schedule, lr, num_steps,
    warmup_fraction)(t)`, lr the grid's (peak) rate: the schedule spans the same `num_steps` the
    learned optimizer is told.

    Args:
      family: the task family the held-out tasks are drawn from.
      learned_tx: theta -> the learned optimizer's optax transform.
      theta: the learned optimizer's meta-parameters.
      num_tasks: how many tasks to draw.
      num_steps: inner training steps per task.
      key: PRNG key of the task draws and training runs.
      adam_lrs: Adam's starting learning-rate grid.
      eval_split: the data split of the loss measured after training.
      max_extensions: the most grid extensions (2 rates each).
      min_grid_points: the fewest rates a grid is tuned over.
      adam_schedule: Adam's schedule, one of `baselines.schedules.SCHEDULES` ("constant", "cosine":
        linear warm-up then cosine decay to 0, "linear": warm-up then linear decay to 0).
      warmup_fraction: f, the warm-up steps W = round(f num_steps) of "cosine" and "linear".

    Returns:
      `{name: {"final_train": mean over tasks of the final train loss, "final_train_median": its
      median over tasks, "valid_median": the median over tasks of the final validation loss (the
      statistic `best_runs` ranks by), "eval": mean eval loss, "curve": mean train loss per step
      (num_steps floats)}}` for "learned" and each Adam rate in ascending rate, named "adam(lr=...)"
      with the constant schedule and "adam:SCHEDULE(lr=...)" (e.g. "adam:cosine(lr=0.01)") with the
      others, plus "best_adam": the name of the best Adam entry, or None when every learning rate
      diverged, and "protocol": {"grid_edge": `protocol.grid_edge` of Adam's runs, "compare":
      `protocol.compare_runs(learned, best Adam)` (time to reach, speedup, ratios) or None,
      "adam_schedule": the schedule's name, "warmup_steps": W (0 with the constant schedule)}.
      ValueError, before anything runs, unless num_tasks, num_steps >= 1 and the grid is non-empty,
      finite and positive.
    """
    check_count(num_tasks, "compare_optimizers: num_tasks")
    check_count(num_steps, "compare_optimizers: num_steps")
    lrs = sorted(check_learning_rates(adam_lrs, "compare_optimizers: adam_lrs"))
    check_schedule(adam_schedule, "compare_optimizers: adam_schedule")
    warmup = 0 if adam_schedule == "constant" else warmup_steps(num_steps, warmup_fraction)
    if len(lrs) < min_grid_points:
        lo, hi = (lrs[0], lrs[-1]) if len(lrs) > 1 else (lrs[0] / 10, lrs[0] * 10)
        lrs = [float(x) for x in np.geomspace(lo, hi, min_grid_points)]
    k_cfg, k_run = jax.random.split(key)
    cfgs = sample_cfgs(family, k_cfg, num_tasks)
    keys = jax.random.split(k_run, num_tasks)
    learned = run_fixed(family, "learned", learned_tx, theta, cfgs, keys, num_steps, eval_split=eval_split)
    adam_tx = lambda lr: optax.adam(lr_schedule(adam_schedule, lr, num_steps, warmup_fraction))
    adam = tune_learning_rate(family, "adam", adam_tx, lrs, cfgs, keys, num_steps, eval_split=eval_split,
                              max_extensions=max_extensions)
    adam_name = "adam" if adam_schedule == "constant" else f"adam:{adam_schedule}"
    label = lambda r: "learned" if r["optimizer"] == "learned" else f"{adam_name}(lr={r['learning_rate']:g})"
    results = {}
    for r in [learned] + adam:
        finals = final_loss(r["losses"])
        results[label(r)] = {"final_train": float(np.mean(finals)), "final_train_median": float(np.median(finals)),
                             "valid_median": float(np.median(r["valids"])), "eval": float(np.mean(r["evals"])),
                             "curve": r["losses"].mean(0).tolist()}
    best_adam = best_runs(adam)["adam"]
    results["best_adam"] = None if best_adam.get("diverged") else label(best_adam)
    results["protocol"] = {"grid_edge": grid_edge(adam, "adam"),
                           "compare": None if best_adam.get("diverged") else compare_runs(learned, best_adam),
                           "adam_schedule": adam_schedule, "warmup_steps": warmup}
    return results


def format_comparison(results: dict, num_steps: int) -> str:
    """A Markdown table of `compare_optimizers` results, the best Adam row marked.

    Args:
      results: `compare_optimizers` output.
      num_steps: the inner steps of the runs (shown in the header).

    Returns:
      a line saying Adam's schedule over the `num_steps` (its warm-up steps and decay; the grid is over
      its peak rate, the best chosen by median validation loss), then the table: one row per
      optimizer with its final train loss (median over tasks, and mean), its median final
      validation loss (which picks the best Adam) and mean eval loss, to 3 significant digits; below
      it, when Adam has a best rate, when the learned optimizer reaches that Adam's final train loss
      and the speedup
      (`outer_trainers.evaluation.protocol`), whether the best rate is still on the grid's edge, and a note
      when every Adam learning rate diverged (no best Adam).
    """
    proto = results.get("protocol") or {}
    lines = [_schedule_caption(proto.get("adam_schedule", "constant"), proto.get("warmup_steps", 0), num_steps), ""]
    lines += [f"| optimizer ({num_steps} inner steps) | final train loss, median | mean | validation loss, median | "
              f"eval loss, mean |", "|---|---|---|---|---|"]
    for name, r in results.items():
        if name in ("best_adam", "protocol"):
            continue
        mark = " (best Adam)" if name == results["best_adam"] else ""
        valid = f"{r['valid_median']:.3g}" if "valid_median" in r else "—"
        lines.append(f"| {name}{mark} | {r['final_train_median']:.3g} | {r['final_train']:.3g} | {valid} | "
                     f"{r['eval']:.3g} |")
    compare = proto.get("compare")
    if results["best_adam"] is None:
        lines.append("\nNo best Adam: every learning rate of the grid diverged (a non-finite loss on some task).")
    elif compare is not None:
        if compare["diverged"]:
            lines.append("\nThe learned optimizer diverged (a non-finite loss on some task).")
        elif compare["steps_to_reach"] is not None:
            lines.append(f"\nThe learned optimizer reaches the best Adam's final train loss at step "
                         f"{compare['steps_to_reach']} of {num_steps} (speedup {compare['speedup']:.2f}x; "
                         f"median over tasks of the trailing mean over {max(1, num_steps // 10)} steps).")
        else:
            lines.append(f"\nThe learned optimizer does not reach the best Adam's final train loss within {num_steps} "
                         f"steps; Adam reaches the learned optimizer's at step {compare['baseline_steps_to_reach']} "
                         f"(speedup {compare['speedup']:.2f}x).")
    if proto.get("grid_edge") and results["best_adam"] is not None:
        lines.append(f"The best Adam rate is still on the {proto['grid_edge']} edge of the extended grid.")
    return "\n".join(lines)


def _schedule_caption(schedule: str, warmup: int, num_steps: int) -> str:
    """The line above `format_comparison`'s table that says how Adam's rate moves over the run."""
    how = {"constant": f"a constant rate over the {num_steps} steps",
           "cosine": f"a linear warm-up from 0 over {warmup} steps, then cosine decay to 0 at step {num_steps}",
           "linear": f"a linear warm-up from 0 over {warmup} steps, then linear decay to 0 at step {num_steps}"}
    return (f"Adam: {how[schedule]}; its (peak) rate is tuned over the grid below, the best rate the one of "
            f"lowest median validation loss.")

"""The written results of an evaluation: Markdown tables, strict JSON and CSV.

    text = results_markdown(title, comparisons, summary, results, steps, seconds, cpu_seconds, profile)  # results.md
    doc = results_json(results, info, comparisons, summary, meta)                                # results.json
    write_csv(path, results, info)                                                               # results.csv

`results` is `{task name: its run dicts}` (`suite_runs.run_task`), `comparisons` is `{"OPT vs
BASELINE": {task: scores.compare_runs(...)}}` and `summary` is `{pair: aggregate.summarize(...)}`
(IQMs with their 95% intervals, shown "iqm [low, high]"). The headline is the test loss at the
end of training; the train loss comes second. A VeLOdrome ratio that is inf is shown "> budget":
the baseline did not reach the optimizer's final validation loss within the task's budget.
A baseline is shown at its best learning rate on validation loss (`tuning.best_runs`), marked when every rate
diverged or when the best rate is still on the grid's edge; a diverged run is written as
"diverged" (Markdown) or null next to its flag (JSON), never as a number.
"""
from __future__ import annotations

import csv
import json
import math
from typing import Any, Optional

import numpy as np

from lopt.file_io import atomic_write_bytes
from outer_trainers.evaluation.scores import final_loss
from outer_trainers.evaluation.tuning import best_runs, grid_edge
from outer_trainers.evaluation.baselines.grid_search import STAGE1_SEEDS, TOP_K

DIVERGED = " (every setting diverged)"  # marks a best_runs entry that won only because all diverged


def format_number(x: Any, fmt: str = ".3g") -> str:
    """A number as the tables show it: "—" for None, "inf", "-inf" or "nan" when not finite.

    Args:
      x: a number or None.
      fmt: the format spec of a finite number.

    Returns:
      the text.
    """
    if x is None:
        return "—"
    if isinstance(x, float) and not math.isfinite(x):
        return "inf" if x > 0 else "-inf" if x < 0 else "nan"
    return format(x, fmt)


def lr_label(run: dict, edge: Optional[str] = None) -> str:
    """How a best run's learning rate is reported: "—" for a learned optimizer, `DIVERGED` added
    when `best_runs` found no setting that did not diverge, "(low/high edge)" when the best rate
    is still on the edge of the (extended) grid.

    Args:
      run: a `best_runs` entry.
      edge: `grid_edge` of its optimizer's runs.

    Returns:
      e.g. "0.001", "—", "0.0001 (every setting diverged)", "1 (high edge)"; a run of
      `grid_search.tune_baseline` adds its decay and schedule: "0.001 wd 0.1 cosine".
    """
    lr = "—" if np.isnan(run["learning_rate"]) else f"{run['learning_rate']:.3g}"
    if "schedule" in run and not np.isnan(run["learning_rate"]):
        lr += f" wd {run['weight_decay']:.3g} {run['schedule']}"
    if run.get("diverged"):
        return lr + DIVERGED
    return lr + (f" ({edge} edge)" if edge and not np.isnan(run["learning_rate"]) else "")


def _median_text(run: dict, key: str) -> str:
    """The median over seeds of `run[key]` to 4 significant digits, "—" when the run has no such entry."""
    return f"{np.median(run[key]):.4g}" if key in run else "—"


def markdown_table(results: dict, num_steps: Any) -> str:
    """A Markdown table of each task's optimizers and best-tuned baselines (`best_runs`).

    Args:
      results: `{task name: run_task's runs}`.
      num_steps: the steps of the runs: an int, or {task name: steps}.

    Returns:
      a caption and the table: per task and optimizer, the best lr on validation loss (`lr_label`),
      the median test loss, test accuracy ("—": not a classifier) and validation loss, and the
      final train loss (median [min, max] over seeds).
    """
    steps = num_steps if isinstance(num_steps, dict) else {t: num_steps for t in results}
    lines = ["| task | steps | optimizer | best lr (on validation loss) | test loss | test accuracy | validation loss | "
             "final train loss, median [min, max] over seeds |", "|---|---|---|---|---|---|---|---|"]
    for task, runs in results.items():
        for name, r in best_runs(runs).items():
            fin = final_loss(r["losses"])
            edge = grid_edge(runs, name) if len([x for x in runs if x["optimizer"] == name]) > 1 else None
            lines.append(f"| {task} | {steps[task]} | {name} | {lr_label(r, edge)} | {_median_text(r, 'evals')} | "
                         f"{_median_text(r, 'accuracy')} | {_median_text(r, 'valids')} | {np.median(fin):.4g} "
                         f"[{np.min(fin):.4g}, {np.max(fin):.4g}] |")
    caption = (f"Final losses after {num_steps} steps" if not isinstance(num_steps, dict) else
               "Final losses after each task's step budget")
    return f"{caption} (medians over seeds); baselines at the learning rate of lowest validation loss.\n\n" + \
        "\n".join(lines)


def _with_interval(s: dict, metric: str, key: str, fmt=None) -> str:
    """A summary's IQM of `metric`, with its 95% interval "[low, high]" when it has one."""
    fmt = fmt or format_number
    interval = s.get("intervals", {}).get(metric)
    if interval is None:
        return fmt(s[key])
    return f"{fmt(interval['iqm'])} [{fmt(interval['ci_low'])}, {fmt(interval['ci_high'])}]"


def budget_ratio(x: Optional[float]) -> str:
    """A VeLOdrome ratio (steps / budget) as the tables show it: "> budget" for inf (not within the budget)."""
    return "> budget" if x is not None and x == math.inf else format_number(x)


def comparison_tables(comparisons: dict, summary: dict) -> str:
    """The headline summary (test loss), the train-loss summary and a per-task table per pair.

    Args:
      comparisons: `{pair: {task: compare_runs(...)}}`, pair = "OPT vs BASELINE".
      summary: `{pair: aggregate.summarize(...)}`.

    Returns:
      Markdown: per pair, wins on test loss, the IQM of the test-loss ratio and of the held-out
      VeLOdrome ratio with their 95% stratified-bootstrap intervals, the diverged, collapsed and
      held-out-exploded tasks; then the secondary table on train loss (wins, IQM train-loss ratio,
      wins on time to reach, IQM speedup); then, per pair, each task's test, validation and train
      losses, test accuracy, ratios, the step at which the baseline's validation curve reaches the
      optimizer's final validation loss (VeLOdrome; "> budget" when it does not within the budget),
      the step at which the optimizer reaches the baseline's final train loss and the speedup
      ("diverged" for a diverged run, "(collapsed)" after a collapsed one's train loss,
      "(exploded)" after an exploded test loss).
    """
    num = format_number
    lines = ["**Test loss at the end of training** (baselines tuned on validation loss)", "",
             "| optimizer vs tuned baseline | tasks | wins: test loss | IQM test-loss ratio [95% CI] | "
             "IQM VeLOdrome on validation loss, steps / budget [95% CI] | diverged on | collapsed on | "
             "held-out exploded on |", "|---|---|---|---|---|---|---|---|"]
    for pair, s in summary.items():
        n = s["num_tasks"]
        lines.append(f"| {pair} | {n} | {s['wins_eval']}/{n} | {_with_interval(s, 'ratio_eval', 'iqm_ratio_eval')} | "
                     f"{_with_interval(s, 'velodrome_ratio', 'iqm_velodrome', budget_ratio)} | "
                     f"{', '.join(s['diverged']) or 'none'} | {', '.join(s.get('collapsed', [])) or 'none'} | "
                     f"{', '.join(s.get('eval_exploded', [])) or 'none'} |")
    lines += ["", "**Train loss** (secondary: the loss being minimised)", "",
              "| optimizer vs tuned baseline | wins: final train loss | IQM train-loss ratio [95% CI] | "
              "wins: time to reach | IQM speedup [95% CI] |", "|---|---|---|---|---|"]
    for pair, s in summary.items():
        n = s["num_tasks"]
        lines.append(f"| {pair} | {s['wins_train']}/{n} | {_with_interval(s, 'ratio_train', 'iqm_ratio_train')} | "
                     f"{s['wins_speed']}/{n} | {_with_interval(s, 'speedup', 'iqm_speedup')} |")
    for pair, per_task in comparisons.items():
        opt, base = pair.split(" vs ")
        lines += ["", f"**{pair}** (medians over seeds; ratio < 1, speedup > 1 and VeLOdrome > 1 favour {opt})",
                  "", f"| task | {opt} test | {base} test | ratio | {opt} validation | {base} validation | "
                  f"{opt} test accuracy | {base} test accuracy | {base} reaches {opt}'s final validation loss at step | "
                  f"VeLOdrome (that / budget) | {opt} final train | {base} final train | ratio | reaches {base}'s "
                  f"final train loss at step | speedup |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for task, c in per_task.items():
            acc = f"{num(c.get('accuracy'))} | {num(c.get('baseline_accuracy'))}"
            if c["diverged"]:
                lines.append(f"| {task} | diverged | {num(c['baseline_eval'], '.4g')} | — | diverged | "
                             f"{num(c.get('baseline_valid'), '.4g')} | {acc} | — | — | diverged | "
                             f"{num(c['baseline_final_train'], '.4g')} | — | — | — |")
                continue
            reach = num(c["steps_to_reach"], "d") if c["steps_to_reach"] is not None else "never"
            velo = num(c["velodrome_steps"], "d") if c["velodrome_steps"] is not None else (
                "—" if c["baseline_diverged"] else "never")
            final = num(c["final_train"], ".4g") + (" (collapsed)" if c.get("collapsed") else "")
            gone = "every lr diverged"
            base_final = gone if c["baseline_diverged"] else num(c["baseline_final_train"], ".4g")
            base_test = gone if c["baseline_diverged"] else num(c["baseline_eval"], ".4g")
            held_out = num(c["eval"], ".4g") + (" (exploded)" if c.get("eval_exploded") else "")
            lines.append(f"| {task} | {held_out} | {base_test} | {num(c['ratio_eval'])} | {num(c.get('valid'), '.4g')} | "
                         f"{num(c.get('baseline_valid'), '.4g')} | {acc} | {velo} | {budget_ratio(c['velodrome_ratio'])} | "
                         f"{final} | {base_final} | {num(c['ratio_train'])} | {reach} | {num(c['speedup'])} |")
    return "\n".join(lines)


def time_to_target_table(times: dict) -> str:
    """Each optimizer's time to reach tuned AdamW's final validation loss, in steps and wall-clock seconds.

    Args:
      times: `{task: suite_runs.target_times(runs)}`.

    Returns:
      Markdown, one row per task and optimizer ("never": its validation curve does not reach the
      target within the budget; "—": no target or no measured step time).
    """
    lines = ["**Time to target** (the step at which the median validation curve first reaches tuned AdamW's "
             "final validation loss, resolved to the curve's spacing, times the measured wall time of one "
             "training step of the optimizer)", "",
             "| task | target: AdamW's final validation loss | optimizer | reached at step | ms per step | seconds |",
             "|---|---|---|---|---|---|"]
    for task, t in times.items():
        for name, x in t["optimizers"].items():
            reached = "—" if t["target"] is None else (str(x["steps"]) if x["steps"] is not None else "never")
            ms = format_number(None if x["step_seconds"] is None else 1e3 * x["step_seconds"])
            lines.append(f"| {task} | {format_number(t['target'], '.4g')} | {name} | {reached} | {ms} | "
                         f"{format_number(x['seconds'])} |")
    return "\n".join(lines)


def profile_table(profile: dict, plotted: bool = False) -> str:
    """The performance profile in a few numbers: per optimizer, the fraction of tasks whose test loss
    is within a factor tau of the best optimizer's, for tau = 1 (the tasks it is best on), 1.1, 2, 10.

    Args:
      profile: `aggregate.performance_profile(results)`.
      plotted: whether performance_profile.png was written (then linked).

    Returns:
      Markdown.
    """
    taus = (1.0, 1.1, 2.0, 10.0)
    n = len(profile["tasks"])
    lines = ["**Performance profile** (test loss / the best optimizer's on each task; diverged: never "
             "within tau)" + (": ![performance profile](performance_profile.png)" if plotted else ""), "",
             "| optimizer | " + " | ".join(f"tasks within {t:g}x of the best" for t in taus) + " |",
             "|---|" + "---|" * len(taus)]
    for name, ratios in profile["ratios"].items():
        r = np.asarray(ratios, np.float64)
        lines.append(f"| {name} | " + " | ".join(f"{int(np.sum(r <= t * (1 + 1e-12)))}/{n}" for t in taus) + " |")
    return "\n".join(lines)


def results_markdown(title: str, comparisons: dict, summary: dict, results: dict, num_steps: dict, seconds: float,
                     cpu_seconds: float, profile: Optional[dict] = None, plotted: bool = False,
                     times: Optional[dict] = None, stage1_seeds: int = STAGE1_SEEDS,
                     top_k: Optional[int] = TOP_K) -> str:
    """results.md: the title, how the baselines were tuned, the cost, `comparison_tables`,
    `profile_table`, `time_to_target_table` and `markdown_table`.

    Args:
      title: the heading, e.g. "learned vs tuned adam on suite smoke".
      comparisons: `{pair: {task: compare_runs(...)}}`.
      summary: `{pair: aggregate.summarize(...)}`.
      results: `{task name: run_task's runs}`.
      num_steps: {task name: steps}.
      seconds: the evaluation's wall time.
      cpu_seconds: its CPU time.
      profile: `aggregate.performance_profile(results)` (None: no profile section).
      plotted: whether performance_profile.png was written.
      times: `{task: suite_runs.target_times(runs)}` (None: no time-to-target section).
      stage1_seeds: the tuning rule's stage-1 seeds (`baselines.grid_search`), as the report states it.
      top_k: its stage-2 points; None: the full grid (every seed at every point).

    Returns:
      the Markdown text, ending with a newline.
    """
    rule = ("full grid (every seed at every point)" if top_k is None else
             f"two-stage rule ({stage1_seeds} seed{'s' if stage1_seeds > 1 else ''} over the grid, every seed at the "
             f"best {top_k} points)")
    prof = f"\n\n{profile_table(profile, plotted)}" if profile is not None else ""
    ttt = f"\n\n{time_to_target_table(times)}" if times else ""
    return (f"# {title}\n\nEach baseline (NAME:SCHEDULE: constant rate, or warm-up + cosine / linear decay to 0 "
            f"over the task's budget; :tuned chooses the schedule) tuned per task over a log-spaced rate grid (7 "
            f"rates) x weight decay (AdamW, Muon) x schedule, extended past an edge holding the best point, by one "
            f"{rule} (outer_trainers.evaluation.baselines), its setting chosen on the final validation loss; scored on the "
            f"test loss (each task's eval split) at the end of training, train loss second; medians over seeds; "
            f"IQMs across tasks with 95% stratified-bootstrap intervals (seeds resampled within each task); "
            f"{seconds / 60:.1f} min ({cpu_seconds / 60:.1f} CPU-min).\n\n{comparison_tables(comparisons, summary)}"
            f"{prof}{ttt}\n\n{markdown_table(results, num_steps)}\n")


def json_safe(x: Any) -> Any:
    """`x` as strict JSON takes it: non-finite floats as None, numpy scalars and arrays as Python ones,
    tuples as lists, dict keys as strings.

    Args:
      x: nested dicts, lists, tuples, numpy arrays and scalars.

    Returns:
      the same structure of Python dicts, lists, numbers, bools, strings and None.
    """
    if isinstance(x, dict):
        return {str(k): json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, np.ndarray)):
        return [json_safe(v) for v in (x.tolist() if isinstance(x, np.ndarray) else x)]
    if isinstance(x, (np.floating, float)):
        return float(x) if math.isfinite(float(x)) else None
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.bool_):
        return bool(x)
    return x


def write_json(path: str, doc: Any) -> None:
    """Writes a `json_safe` document atomically (indent 1), so a reader never sees half a file.

    Args:
      path: the JSON file.
      doc: the document.
    """
    atomic_write_bytes(path, json.dumps(doc, indent=1).encode("utf-8"))


def write_text(path: str, text: str) -> None:
    """Writes a text file (UTF-8) atomically, so a reader never sees half a file.

    Args:
      path: the file.
      text: its content.
    """
    atomic_write_bytes(path, text.encode("utf-8"))


def results_json(results: dict, info: dict, comparisons: dict, summary: dict, meta: dict) -> dict:
    """The machine-readable results (results.json).

    Args:
      results: `{task name: run_task's runs}`.
      info: `{task name: {"num_steps", "seeds", "eval_split", "seconds"}}`.
      comparisons: `{pair: {task: compare_runs(...)}}`.
      summary: `{pair: aggregate.summarize(...)}`.
      meta: run-level entries (suite, optimizers, baselines, protocol, seconds, performance_profile).

    Returns:
      `{**meta, "summary": summary, "tasks": {task: {**info, "optimizers": {name: {"learning_rates",
      "best_learning_rate" (None for a learned optimizer), "best_weight_decay", "best_schedule" and
      "settings" [[lr, decay, schedule] per run] (decay and schedule None unless tuned by
      `grid_search`), "grid_edge", "every_rate_diverged",
      "final_train" [per seed], "eval" (test loss) [per seed], "valid" [per seed], "accuracy" [per
      seed] (None: not a classifier), "valid_steps" [K], "valid_curve" [per seed][K], "step_seconds",
      "initial_train" [per seed]}}, "comparisons":
      {pair: ...}}}}`, strict-JSON safe (non-finite numbers as None).
    """
    tasks_out = {}
    for task, runs in results.items():
        opts = {}
        for name, best in best_runs(runs).items():
            own = [r for r in runs if r["optimizer"] == name]
            tuned = len(own) > 1 or not np.isnan(own[0]["learning_rate"])
            opts[name] = {"learning_rates": [r["learning_rate"] for r in own] if tuned else None,
                          "best_learning_rate": best["learning_rate"] if tuned else None,
                          "best_weight_decay": best.get("weight_decay"), "best_schedule": best.get("schedule"),
                          "settings": [[r["learning_rate"], r.get("weight_decay"), r.get("schedule")] for r in own]
                          if tuned else None,
                          "grid_edge": grid_edge(runs, name) if tuned else None,
                          "every_rate_diverged": bool(best.get("diverged", False)),
                          "final_train": final_loss(best["losses"]), "eval": best["evals"],
                          "valid": best.get("valids"), "accuracy": best.get("accuracy"),
                          "valid_steps": best.get("valid_steps"), "valid_curve": best.get("valid_curve"),
                          "step_seconds": best.get("step_seconds"), "initial_train": best["losses"][:, 0]}
        tasks_out[task] = {**info[task], "optimizers": opts,
                           "comparisons": {pair: per[task] for pair, per in comparisons.items()}}
    return json_safe({**meta, "summary": summary, "tasks": tasks_out})


def write_csv(path: str, results: dict, info: dict) -> None:
    """Writes every run of every task, one row per seed, to a CSV file.

    Columns: task, optimizer, learning_rate (empty for a learned optimizer), seed,
    final_train_loss (`final_loss`), valid_loss, test_loss, test_accuracy (empty when not measured),
    weight_decay, schedule (empty unless tuned by `grid_search`).

    Args:
      path: the CSV file to write.
      results: `{task name: run_task's runs}`.
      info: `{task name: {"seeds": [...], ...}}`.
    """
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["task", "optimizer", "learning_rate", "seed", "final_train_loss", "valid_loss", "test_loss",
                    "test_accuracy", "weight_decay", "schedule"])
        cell = lambda r, key, i: f"{r[key][i]:.6g}" if key in r else ""
        for task, runs in results.items():
            for r in runs:
                lr = "" if np.isnan(r["learning_rate"]) else f"{r['learning_rate']:.6g}"
                finals = final_loss(r["losses"])
                for i, s in enumerate(info[task]["seeds"]):
                    w.writerow([task, r["optimizer"], lr, s, f"{finals[i]:.6g}", cell(r, "valids", i),
                                cell(r, "evals", i), cell(r, "accuracy", i),
                                f"{r['weight_decay']:.6g}" if "weight_decay" in r else "", r.get("schedule", "")])

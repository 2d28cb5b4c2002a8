#!/usr/bin/env python
"""Evaluate optimizers against baselines tuned per task, on an evaluation suite or a list of tasks.

    python scripts/evaluate.py --suite heldout-cpu --optimizer run/theta_final.msgpack --output_dir eval/
    python scripts/evaluate.py --suite heldout-cpu --optimizer pretrained:NAME --baselines adam --output_dir eval/
    python scripts/evaluate.py --optimizer run/theta_final.msgpack --task "QuadraticFamily(dim=10)" \
        --task "ImageMLPFamily(hidden_sizes=(32,))" --num_steps 500 --num_seeds 3 --output_dir eval/

`--optimizer` (repeatable; `--theta PATH` is the same as `--optimizer PATH`) is a theta file
(`lopt.save_theta`), `pretrained:NAME` (`lopt.pretrained.load(NAME, num_steps=...)`) or a
baseline name (adam, adamw, sgdm: then it is tuned like a baseline). A learned optimizer is told
each task's step budget and is not tuned. A suite (`tasks.suites`, e.g. heldout-cpu, smoke) fixes
the tasks, their step budgets, seeds and eval split; `--task` (a gin-style constructor call of a
public tasks class; a family draws one task per seed) takes `--num_steps` and `--num_seeds`.

The protocol is outer_trainers.evaluation.protocol's: every baseline (`--baselines`, default adam, adamw and
sgdm = SGD with momentum 0.9) is trained per task at each rate of a 7-point log-spaced grid
(1e-4..1e-1; SGD 1e-3..1) for every seed, all rates and seeds in one jitted program, and the grid
is extended while the best rate (lowest median final train loss over seeds; a diverged seed
loses) lies on its edge. Each optimizer is then scored against each tuned baseline: final train
loss (mean of the last 10% of steps), held-out loss on the eval split ("test") after training,
their ratios, time to reach the baseline's final train loss and the speedup; the summary counts
wins per metric and gives the interquartile means (IQM) of the ratios and speedups. Writes to
output_dir (refusing to replace an earlier evaluation's files unless --overwrite):

    results.json  everything below, machine-readable (non-finite numbers as null, with flags)
    results.md    the summary table and the per-task tables
    results.csv   task, optimizer, learning_rate, seed, final_train_loss, eval_loss for every run
    curves.png    per task: train-loss curves (median over seeds, min-max band) of each optimizer
                  and each baseline at its best rate
    curves.npz    every curve, [seeds, steps] per (task, optimizer, lr)

Every argument is checked, and every suite task's data loaded, before any training or file is
written (`check_arguments`).

The stability check replaces the comparison with `--stress_steps N`: each learned optimizer
(no baselines) trains every task of the suite (or of `--task`) for N steps, told the horizon N, and
a seed fails when a loss goes non-finite or the final train loss is not below the initial one
(`stress`; stress.json and stress.md; exit status 1 on a failure):

    python scripts/evaluate.py --suite heldout-cpu --optimizer pretrained:NAME --stress_steps 8000 --output_dir st/
"""
from __future__ import annotations

import argparse
import ast
import csv
import json
import math
import os
import resource
import time
from typing import Any, Optional, Sequence

import gin
import jax
import jax.numpy as jnp
import numpy as np

import lopt
from lopt.file_io import atomic_write_bytes
import outer_trainers as ot
from outer_trainers.evaluation import protocol
from outer_trainers.evaluation.scores import final_loss
from outer_trainers.evaluation.tuning import best_runs, check_learning_rates
from outer_trainers.gin_registry import load_config  # importing gin_registry registers the public API with gin
from tasks import suites
from tasks.base import Task, TaskFamily, check_count, single_task_family
from tasks.conv import ConvFamily

RESULT_FILES = ("results.csv", "curves.png", "results.md", "curves.npz", "results.json")
ADAM_LRS = protocol.default_lrs("adam")
ADAMW_LRS = protocol.default_lrs("adamw")
SGDM_LRS = protocol.default_lrs("sgdm")
DIVERGED = " (every setting diverged)"  # marks a best_runs entry that won only because all diverged


def resolve_optimizer(spec: str, label: str) -> dict:
    """What an `--optimizer` value names, loaded and checked.

    Args:
      spec: a baseline name, "pretrained:NAME", a theta file path or an outer_train checkpoint file.
      label: the optimizer's name in the results.

    Returns:
      `{"label", "spec", "kind": "baseline" | "pretrained" | "theta", ...}` with the learned
      optimizer and theta for a theta file, the pretrained name for "pretrained:".

    Raises:
      ValueError: an unknown pretrained name (or lopt.pretrained without `load`), or an unreadable theta file.
    """
    if spec in protocol.baseline_names():
        return {"label": label, "spec": spec, "kind": "baseline"}
    if spec.startswith("pretrained:"):
        name = spec[len("pretrained:"):]
        try:
            from lopt import pretrained
        except ImportError as e:
            raise ValueError(f"evaluate: --optimizer {spec}: lopt.pretrained cannot be imported ({e})") from None
        if not (hasattr(pretrained, "load") and hasattr(pretrained, "names")):
            raise ValueError(f"evaluate: --optimizer {spec}: this lopt ships no pretrained optimizers yet "
                             f"(lopt.pretrained has no load/names)")
        if name not in pretrained.names():
            raise ValueError(f"evaluate: --optimizer {spec}: no pretrained optimizer named {name!r}; "
                             f"lopt.pretrained.names() = {list(pretrained.names())}")
        return {"label": label, "spec": spec, "kind": "pretrained", "name": name, "module": pretrained}
    if not os.path.isfile(spec):
        raise ValueError(f"evaluate: --optimizer {spec!r} is neither a baseline ({', '.join(protocol.baseline_names())}), "
                         f"nor pretrained:NAME, nor an existing theta or checkpoint file")
    try:
        learned_opt, theta = lopt.load_learned_optimizer(spec)
    except Exception as theta_error:  # not a theta file: an outer_train checkpoint?
        try:
            learned_opt, theta = ot.theta_from_checkpoint(spec)
        except Exception as ckpt_error:
            raise ValueError(f"evaluate: --optimizer {spec}: neither a theta file ({theta_error}) nor an outer_train "
                             f"checkpoint ({ckpt_error})") from None
    return {"label": label, "spec": spec, "kind": "theta", "learned_opt": learned_opt, "theta": theta}


def _labels(specs: Sequence[str]) -> list[str]:
    """Result names: a baseline keeps its name, pretrained:NAME too, one theta file is "learned",
    several are their file stems (made unique)."""
    files = [s for s in specs if s not in protocol.baseline_names() and not s.startswith("pretrained:")]
    labels = []
    for s in specs:
        if s in files:
            label = "learned" if len(files) == 1 else os.path.splitext(os.path.basename(s))[0]
        else:
            label = s
        labels.append(label if label not in labels else f"{label}_{len(labels)}")
    return labels


def task_draws(family: TaskFamily, seeds: Sequence[int]) -> tuple[Any, jax.Array]:
    """The task cfgs and run keys of `seeds`: seed s draws its cfg from `fold_in(key(s), 0)` and runs
    with `fold_in(key(s), 1)`, so every optimizer sees the same tasks and initialisations.

    Args:
      family: the task family.
      seeds: one task draw and run key per seed.

    Returns:
      (cfgs batched over seeds, run keys [S]).
    """
    keys = [jax.random.key(s) for s in seeds]
    cfgs = jax.vmap(family.sample)(jnp.stack([jax.random.fold_in(k, 0) for k in keys]))
    return cfgs, jnp.stack([jax.random.fold_in(k, 1) for k in keys])


def run_learned(opt: dict, family: TaskFamily, num_steps: int, cfgs: Any, run_keys: jax.Array, *,
                eval_split: str, sequential: bool) -> dict:
    """Trains every seed with a learned optimizer (a theta file or a pretrained one), told `num_steps`.

    Args:
      opt: a `resolve_optimizer` result of kind "theta" or "pretrained".
      family: the task family `cfgs` were drawn from.
      num_steps: training steps per run, also the optimizer's horizon.
      cfgs: S task cfgs.
      run_keys: S run keys.
      eval_split: the data split of the held-out loss after training.
      sequential: run the seeds one after another in the program.

    Returns:
      `protocol.run_fixed`'s run dict.
    """
    common = dict(eval_split=eval_split, sequential=sequential)
    if opt["kind"] == "theta":
        lo = opt["learned_opt"]
        return protocol.run_fixed(family, opt["label"], lambda th: lo.opt_fn(th, num_steps=num_steps), opt["theta"],
                                  cfgs, run_keys, num_steps, **common)
    load = opt["module"].load
    return protocol.run_fixed(family, opt["label"], lambda _: load(opt["name"], num_steps=num_steps),
                              jnp.zeros(()), cfgs, run_keys, num_steps, **common)


def run_task(family: TaskFamily, num_steps: int, seeds: Sequence[int], optimizers: Sequence[dict],
             baselines: Sequence[str], grids: dict, eval_split: str, *, momentum: float = 0.9,
             weight_decay: float = 1e-2, max_extensions: int = 4) -> tuple[list[dict], dict]:
    """Trains one task per seed with every optimizer and every baseline (tuned: `protocol.tune_learning_rate`).

    Every setting sees the same task draws and initialisations: seed s draws its cfg from
    `fold_in(key(s), 0)` and runs with `fold_in(key(s), 1)`. Convnets run their rates and seeds in
    sequence inside each program, everything else vmapped.

    Args:
      family: the task family (a Task lifted by `single_task_family` draws the same task every seed).
      num_steps: training steps per run (also each learned optimizer's horizon).
      seeds: one task draw and run key per seed.
      optimizers: `resolve_optimizer` results.
      baselines: baseline names, each tuned.
      grids: {baseline name: its starting learning-rate grid}.
      eval_split: the data split of the held-out loss after training.
      momentum: SGD's momentum.
      weight_decay: AdamW's weight decay.
      max_extensions: the most grid extensions per baseline.

    Returns:
      (runs, seconds): the run dicts (`{"optimizer", "learning_rate" (NaN for a learned optimizer),
      "losses" [S, num_steps], "evals" [S]}`, float64), optimizers first, and {name: wall seconds}.
    """
    cfgs, run_keys = task_draws(family, seeds)
    common = dict(eval_split=eval_split, sequential=isinstance(family, ConvFamily))  # see make_task_trainer
    runs, seconds, tuned = [], {}, set()

    def tune(label, name):
        make_tx = protocol.baseline(name, momentum=momentum, weight_decay=weight_decay)
        return protocol.tune_learning_rate(family, label, make_tx, grids[name], cfgs, run_keys, num_steps,
                                           max_extensions=max_extensions, **common)

    for opt in optimizers:
        start = time.perf_counter()
        if opt["kind"] == "baseline":
            runs += tune(opt["label"], opt["spec"])
            if opt["label"] == opt["spec"]:
                tuned.add(opt["spec"])  # a baseline evaluated as an optimizer is not tuned twice
        else:
            runs.append(run_learned(opt, family, num_steps, cfgs, run_keys, **common))
        seconds[opt["label"]] = time.perf_counter() - start
    for name in baselines:
        if name in tuned:
            continue
        start = time.perf_counter()
        runs += tune(name, name)
        seconds[name] = time.perf_counter() - start
    return runs, seconds


def write_csv(path: str, results: dict, info: dict) -> None:
    """Writes every run of every task, one row per seed, to a CSV file.

    Args:
      path: the CSV file to write.
      results: `{task name: run_task's runs}`.
      info: `{task name: {"seeds": [...], ...}}`.
    """
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["task", "optimizer", "learning_rate", "seed", "final_train_loss", "eval_loss"])
        for task, runs in results.items():
            for r in runs:
                lr = "" if np.isnan(r["learning_rate"]) else f"{r['learning_rate']:.6g}"
                finals = final_loss(r["losses"])
                for i, s in enumerate(info[task]["seeds"]):
                    w.writerow([task, r["optimizer"], lr, s, f"{finals[i]:.6g}", f"{r['evals'][i]:.6g}"])


def lr_label(run: dict, edge: Optional[str] = None) -> str:
    """How a best run's learning rate is reported: "—" for a learned optimizer, `DIVERGED` added
    when `best_runs` found no setting that did not diverge, "(low/high edge)" when the best rate
    is still on the edge of the (extended) grid.

    Args:
      run: a `best_runs` entry.
      edge: `protocol.grid_edge` of its optimizer's runs.

    Returns:
      e.g. "0.001", "—", "0.0001 (every setting diverged)", "1 (high edge)".
    """
    lr = "—" if np.isnan(run["learning_rate"]) else f"{run['learning_rate']:.3g}"
    if run.get("diverged"):
        return lr + DIVERGED
    return lr + (f" ({edge} edge)" if edge and not np.isnan(run["learning_rate"]) else "")


def markdown_table(results: dict, num_steps: Any) -> str:
    """A Markdown table of each task's optimizers and best-tuned baselines (`best_runs`).

    Args:
      results: `{task name: run_task's runs}`.
      num_steps: the steps of the runs: an int, or {task name: steps}.

    Returns:
      a caption and the table: per task and optimizer, the best lr (`lr_label`) and the final
      train loss (median [min, max] over seeds) and median eval loss.
    """
    steps = num_steps if isinstance(num_steps, dict) else {t: num_steps for t in results}
    lines = ["| task | steps | optimizer | best lr | final train loss, median [min, max] over seeds | "
             "eval loss (median) |", "|---|---|---|---|---|---|"]
    for task, runs in results.items():
        for name, r in best_runs(runs).items():
            fin = final_loss(r["losses"])
            edge = protocol.grid_edge(runs, name) if len([x for x in runs if x["optimizer"] == name]) > 1 else None
            lines.append(f"| {task} | {steps[task]} | {name} | {lr_label(r, edge)} | {np.median(fin):.4g} "
                         f"[{np.min(fin):.4g}, {np.max(fin):.4g}] | {np.median(r['evals']):.4g} |")
    caption = (f"Final losses after {num_steps} steps" if not isinstance(num_steps, dict) else
               "Final losses after each task's step budget")
    return f"{caption}; baselines at their best learning rate.\n\n" + "\n".join(lines)


def _num(x: Any, fmt: str = ".3g") -> str:
    if x is None:
        return "—"
    if isinstance(x, float) and not math.isfinite(x):
        return "inf" if x > 0 else "-inf" if x < 0 else "nan"
    return format(x, fmt)


def comparison_tables(comparisons: dict, summary: dict) -> str:
    """The summary table (one row per optimizer-vs-baseline pair) and a per-task table per pair.

    Args:
      comparisons: `{pair: {task: protocol.compare_runs(...)}}`, pair = "OPT vs BASELINE".
      summary: `{pair: protocol.summarize(...)}`.

    Returns:
      Markdown: wins per metric, IQMs of the loss ratios and speedups, diverged tasks; then, per
      pair, each task's final train and held-out losses, ratios, the step at which the optimizer
      reaches the baseline's final train loss and the speedup ("diverged" for a diverged run).
    """
    lines = ["| optimizer vs tuned baseline | tasks | wins: final train loss | wins: held-out loss | "
             "wins: time to reach | IQM train-loss ratio | IQM held-out-loss ratio | IQM speedup | diverged on |",
             "|---|---|---|---|---|---|---|---|---|"]
    for pair, s in summary.items():
        n = s["num_tasks"]
        lines.append(f"| {pair} | {n} | {s['wins_train']}/{n} | {s['wins_eval']}/{n} | {s['wins_speed']}/{n} | "
                     f"{_num(s['iqm_ratio_train'])} | {_num(s['iqm_ratio_eval'])} | {_num(s['iqm_speedup'])} | "
                     f"{', '.join(s['diverged']) or 'none'} |")
    for pair, per_task in comparisons.items():
        opt, base = pair.split(" vs ")
        lines += ["", f"**{pair}** (medians over seeds; ratio < 1 and speedup > 1 favour {opt})", "",
                  f"| task | {opt} final train | {base} final train | ratio | {opt} held-out | {base} held-out | "
                  f"ratio | reaches {base}'s final train loss at step | speedup |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for task, c in per_task.items():
            if c["diverged"]:
                lines.append(f"| {task} | diverged | {_num(c['baseline_final_train'], '.4g')} | — | diverged | "
                             f"{_num(c['baseline_eval'], '.4g')} | — | — | — |")
                continue
            reach = _num(c["steps_to_reach"], "d") if c["steps_to_reach"] is not None else "never"
            base_final = "every lr diverged" if c["baseline_diverged"] else _num(c["baseline_final_train"], ".4g")
            lines.append(f"| {task} | {_num(c['final_train'], '.4g')} | {base_final} | {_num(c['ratio_train'])} | "
                         f"{_num(c['eval'], '.4g')} | {_num(c['baseline_eval'], '.4g')} | {_num(c['ratio_eval'])} | "
                         f"{reach} | {_num(c['speedup'])} |")
    return "\n".join(lines)


def plot_curves(path: str, results: dict) -> None:
    """Plots, per task, the train-loss curves of every optimizer and baseline at its best rate.

    Each curve is the median over seeds with a min–max band; the y axis is clipped at 10× the
    largest median starting loss (so diverging curves do not squash the others) and is
    logarithmic when every finite run's losses are >= 0 (a loss of exactly 0, a saturated
    cross-entropy, is clipped to the bottom). Up to 4 tasks per row.

    Args:
      path: the PNG file to write.
      results: `{task name: run_task's runs}`.
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    n = len(results)
    cols = min(n, 4)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 4 * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    for ax, (task, runs) in zip(axes.flat, results.items()):
        for name, r in best_runs(runs).items():
            losses = r["losses"]
            steps = np.arange(1, losses.shape[1] + 1)
            label = name if np.isnan(r["learning_rate"]) else f"{name} (lr={r['learning_rate']:.2g})"
            label += DIVERGED if r.get("diverged") else ""
            ax.plot(steps, np.median(losses, 0), label=label)
            ax.fill_between(steps, np.min(losses, 0), np.max(losses, 0), alpha=0.2)
        if all(np.all(np.asarray(r["losses"]) >= 0) for r in runs if np.all(np.isfinite(r["losses"]))):
            ax.set_yscale("log", nonpositive="clip")  # before the limit below, which a linear axis would set below 0
        starts = [np.median(r["losses"][:, 0]) for r in runs if np.all(np.isfinite(r["losses"][:, 0]))]
        if starts and np.isfinite(max(starts)):  # keep diverging curves from squashing the others
            ax.set_ylim(top=max(10 * max(starts), 1e-12) if max(starts) > 0 else None)
        ax.set_title(task)
        ax.set_xlabel("step")
        ax.set_ylabel("train loss")
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _cpu_seconds() -> float:
    """User + system CPU time of this process so far (all threads), in seconds."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _json_safe(x: Any) -> Any:
    """Non-finite floats as None, numpy scalars as Python ones, tuples as lists (strict JSON)."""
    if isinstance(x, dict):
        return {str(k): _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, np.ndarray)):
        return [_json_safe(v) for v in (x.tolist() if isinstance(x, np.ndarray) else x)]
    if isinstance(x, (np.floating, float)):
        return float(x) if math.isfinite(float(x)) else None
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.bool_):
        return bool(x)
    return x


def results_json(results: dict, info: dict, comparisons: dict, summary: dict, meta: dict) -> dict:
    """The machine-readable results (results.json).

    Args:
      results: `{task name: run_task's runs}`.
      info: `{task name: {"num_steps", "seeds", "eval_split", "seconds"}}`.
      comparisons: `{pair: {task: compare_runs(...)}}`.
      summary: `{pair: summarize(...)}`.
      meta: run-level entries (suite, optimizers, baselines, protocol, seconds).

    Returns:
      `{**meta, "summary": summary, "tasks": {task: {**info, "optimizers": {name: {"learning_rates",
      "best_learning_rate" (None for a learned optimizer), "grid_edge", "every_rate_diverged",
      "final_train" [per seed], "eval" [per seed], "initial_train" [per seed]}}, "comparisons":
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
                          "grid_edge": protocol.grid_edge(runs, name) if tuned else None,
                          "every_rate_diverged": bool(best.get("diverged", False)),
                          "final_train": final_loss(best["losses"]), "eval": best["evals"],
                          "initial_train": best["losses"][:, 0]}
        tasks_out[task] = {**info[task], "optimizers": opts,
                           "comparisons": {pair: per[task] for pair, per in comparisons.items()}}
    return _json_safe({**meta, "summary": summary, "tasks": tasks_out})


@gin.configurable
def evaluate(output_dir: str, *, optimizers: Sequence[str] = (), theta_path: Optional[str] = None,
             suite: Optional[str] = None, tasks: Sequence[Any] = (), num_steps: int = 1000, num_seeds: int = 3,
             baselines: Sequence[str] = ("adam", "adamw", "sgdm"), adam_lrs: Sequence[float] = ADAM_LRS,
             adamw_lrs: Sequence[float] = ADAMW_LRS, sgdm_lrs: Sequence[float] = SGDM_LRS, momentum: float = 0.9,
             weight_decay: float = 1e-2, eval_split: str = "test", max_extensions: int = 4,
             overwrite: bool = False) -> dict:
    """Runs the evaluation of the module docstring and writes its five files to `output_dir`.

    Args:
      output_dir: where the result files go (created if missing).
      optimizers: the optimizers evaluated: theta file paths, "pretrained:NAME" or baseline names.
      theta_path: one more theta file (the older spelling of an optimizer).
      suite: a `tasks.suites` name; its tasks bring their own steps, seeds and eval split.
      tasks: Tasks or TaskFamilies instead of a suite; a repeated name gets its index appended.
      num_steps: training steps per run of `tasks`.
      num_seeds: task draws (and run keys) per task of `tasks`, seeds 0 .. num_seeds - 1.
      baselines: the tuned baselines each optimizer is compared with ("adam", "adamw", "sgdm").
      adam_lrs: Adam's starting learning-rate grid.
      adamw_lrs: AdamW's starting learning-rate grid.
      sgdm_lrs: SGD-with-momentum's starting learning-rate grid.
      momentum: SGD's momentum.
      weight_decay: AdamW's weight decay.
      eval_split: the data split of the held-out loss of `tasks` (a suite task has its own).
      max_extensions: the most extensions of a baseline's grid past its edge (2 rates each).
      overwrite: replace the result files of an earlier evaluation in `output_dir` (otherwise refused).

    Returns:
      `{"results": {task: runs}, "comparisons": ..., "summary": ..., "json": results.json's content}`.

    Raises:
      ValueError (TypeError for a task of another type), before any training or file is written,
      naming the argument: see `check_arguments`.
    """
    specs = list(optimizers) + ([theta_path] if theta_path else [])
    plan = check_arguments(output_dir, specs, suite, tasks, num_steps, num_seeds, baselines,
                           {"adam": adam_lrs, "adamw": adamw_lrs, "sgdm": sgdm_lrs}, momentum, eval_split,
                           max_extensions)
    existing = [f for f in RESULT_FILES if os.path.exists(os.path.join(output_dir, f))]
    if existing and not overwrite:
        raise ValueError(f"evaluate: {output_dir} already holds the results of an evaluation ({', '.join(existing)}); "
                         f"choose another --output_dir or pass --overwrite to replace them")
    opts = [resolve_optimizer(s, label) for s, label in zip(specs, _labels(specs))]
    grids = {"adam": tuple(adam_lrs), "adamw": tuple(adamw_lrs), "sgdm": tuple(sgdm_lrs)}
    results, info, start, cpu_start = {}, {}, time.perf_counter(), _cpu_seconds()
    for name, family, steps, seeds, split in plan:
        runs, seconds = run_task(family, steps, seeds, opts, baselines, grids, split, momentum=momentum,
                                 weight_decay=weight_decay, max_extensions=max_extensions)
        results[name] = runs
        info[name] = {"num_steps": steps, "seeds": list(seeds), "eval_split": split, "seconds": seconds}
        print(f"{name}: {steps} steps x {len(seeds)} seeds in {sum(seconds.values()):.0f} s", flush=True)
    total, cpu = time.perf_counter() - start, _cpu_seconds() - cpu_start
    comparisons, summary = {}, {}
    for opt in opts:
        for base in baselines:
            if opt["label"] == base:
                continue
            pair = f"{opt['label']} vs {base}"
            comparisons[pair] = {t: protocol.compare_runs(best_runs(runs)[opt["label"]], best_runs(runs)[base])
                                 for t, runs in results.items()}
            summary[pair] = protocol.summarize(comparisons[pair])
    meta = {"suite": suite, "optimizers": {o["label"]: o["spec"] for o in opts}, "baselines": list(baselines),
            "protocol": {"grid": {b: list(grids[b]) for b in baselines}, "extend_by": 2,
                         "max_extensions": max_extensions, "tuning": "lowest median over seeds of the final "
                         "train loss; a diverged seed loses", "final_train": "mean train loss of the last 10% "
                         "of steps", "statistic": "median over seeds", "speedup": "see outer_trainers.evaluation.protocol"},
            "seconds": total, "cpu_seconds": cpu}
    doc = results_json(results, info, comparisons, summary, meta)
    os.makedirs(output_dir, exist_ok=True)
    write_csv(os.path.join(output_dir, "results.csv"), results, info)
    plot_curves(os.path.join(output_dir, "curves.png"), results)
    np.savez(os.path.join(output_dir, "curves.npz"),
             **{f"{t}/{r['optimizer']}/{r['learning_rate']:.6g}": r["losses"] for t, runs in results.items()
                for r in runs})
    atomic_write_bytes(os.path.join(output_dir, "results.json"), json.dumps(doc, indent=1).encode("utf-8"))
    what = f"suite {suite}" if suite else f"{len(results)} tasks"
    title = f"{', '.join(o['label'] for o in opts)} vs tuned {', '.join(baselines)} on {what}"
    steps = {t: i["num_steps"] for t, i in info.items()}
    text = (f"# {title}\n\nEach baseline tuned per task over a log-spaced learning-rate grid (7 rates, extended "
            f"past an edge holding the best rate); medians over seeds; held-out loss on each task's eval split; "
            f"{total / 60:.1f} min ({cpu / 60:.1f} CPU-min).\n\n{comparison_tables(comparisons, summary)}\n\n"
            f"{markdown_table(results, steps)}\n")
    atomic_write_bytes(os.path.join(output_dir, "results.md"), text.encode("utf-8"))
    print(text)
    return {"results": results, "comparisons": comparisons, "summary": summary, "json": doc}


STRESS_FILES = ("stress.json", "stress.md")


@gin.configurable
def stress(output_dir: str, *, stress_steps: int, optimizers: Sequence[str] = (), theta_path: Optional[str] = None,
           suite: Optional[str] = None, tasks: Sequence[Any] = (), num_seeds: int = 3, eval_split: str = "test",
           overwrite: bool = False) -> dict:
    """The stability check: every learned optimizer trains every task for `stress_steps` steps.

    Each optimizer is told the horizon `stress_steps` (as a user would call `opt_fn(theta,
    num_steps=...)` or `lopt.pretrained.load(name, num_steps=...)`) and trains each task once per
    seed (the suite's seeds, or `num_seeds` of `tasks`), with the same draws as `evaluate`. A seed
    passes when its losses stay finite and its final train loss ends below its initial one
    (`protocol.stability`). Meant for horizons past the meta-training ones (issue #17's bar: 4x)
    and for tasks wider than any meta-training task. Writes stress.json and stress.md.

    Args:
      output_dir: where the two files go (created if missing).
      stress_steps: the training steps (and horizon) of every run (>= 1).
      optimizers: learned optimizers: theta or checkpoint file paths, or "pretrained:NAME".
      theta_path: one more theta file.
      suite: a `tasks.suites` name; its tasks bring their seeds and eval split (not their budgets).
      tasks: Tasks or TaskFamilies instead of a suite.
      num_seeds: task draws per task of `tasks`.
      eval_split: the data split of the held-out loss of `tasks`.
      overwrite: replace the files of an earlier stability check in `output_dir` (otherwise refused).

    Returns:
      `{"stress_steps", "optimizers", "tasks": {task: {optimizer: protocol.stability(...)}}, "failures":
      ["task / optimizer"], "all_ok"}` (also stress.json's content).

    Raises:
      ValueError: as `check_arguments`, or a baseline among `optimizers` (a baseline needs a tuned rate).
    """
    specs = list(optimizers) + ([theta_path] if theta_path else [])
    plan = check_arguments(output_dir, specs, suite, tasks, stress_steps, num_seeds, (), {}, 0.9, eval_split)
    baselines = [s for s in specs if s in protocol.baseline_names()]
    if baselines:
        raise ValueError(f"evaluate: the stability check (--stress_steps) runs learned optimizers only; {baselines} "
                         f"are baselines, which need a tuned learning rate (use the comparison instead)")
    existing = [f for f in STRESS_FILES if os.path.exists(os.path.join(output_dir, f))]
    if existing and not overwrite:
        raise ValueError(f"evaluate: {output_dir} already holds a stability check ({', '.join(existing)}); "
                         f"choose another --output_dir or pass --overwrite to replace it")
    opts = [resolve_optimizer(s, label) for s, label in zip(specs, _labels(specs))]
    out, failures, start = {}, [], time.perf_counter()
    rows = ["| task | optimizer | seed | initial | final | max | held-out | |", "|---|---|---|---|---|---|---|---|"]
    for name, family, _, seeds, split in plan:
        cfgs, run_keys = task_draws(family, seeds)
        out[name] = {}
        for opt in opts:
            t0 = time.perf_counter()
            run = run_learned(opt, family, stress_steps, cfgs, run_keys, eval_split=split,
                              sequential=True)  # long runs: one seed at a time keeps memory flat
            st = protocol.stability(run)
            out[name][opt["label"]] = {**st, "seeds": list(seeds), "seconds": time.perf_counter() - t0}
            if not st["all_ok"]:
                failures.append(f"{name} / {opt['label']}")
            for i, seed in enumerate(seeds):
                rows.append(f"| {name} | {opt['label']} | {seed} | {_num(st['initial'][i], '.4g')} | "
                            f"{_num(st['final'][i], '.4g')} | {_num(st['max'][i], '.4g')} | {_num(st['eval'][i], '.4g')} "
                            f"| {'ok' if st['ok'][i] else '**FAIL**'} |")
            print(f"{name} / {opt['label']}: {'ok' if st['all_ok'] else 'FAIL'} (final {_num(max(st['final']), '.4g')}, "
                  f"initial {_num(min(st['initial']), '.4g')}) in {time.perf_counter() - t0:.0f} s", flush=True)
    doc = _json_safe({"stress_steps": stress_steps, "suite": suite, "optimizers": {o["label"]: o["spec"] for o in opts},
                      "tasks": out, "failures": failures, "all_ok": not failures,
                      "seconds": time.perf_counter() - start})
    os.makedirs(output_dir, exist_ok=True)
    atomic_write_bytes(os.path.join(output_dir, "stress.json"), json.dumps(doc, indent=1).encode("utf-8"))
    verdict = "Every run passed" if not failures else f"FAILED: {', '.join(failures)}"
    text = (f"# Stability check: {stress_steps} steps\n\nEach optimizer told the horizon {stress_steps}; a seed "
            f"passes when its losses stay finite and the final train loss (mean of the last 10% of steps) is below "
            f"the initial one (mean of the first 1%). {verdict}.\n\n" + "\n".join(rows) + "\n")
    atomic_write_bytes(os.path.join(output_dir, "stress.md"), text.encode("utf-8"))
    print(verdict)
    return doc


def check_arguments(output_dir: str, optimizers: Sequence[str], suite: Optional[str], tasks: Sequence[Any],
                    num_steps: int, num_seeds: int, baselines: Sequence[str], grids: dict, momentum: float,
                    eval_split: str, max_extensions: int = 4) -> list[tuple]:
    """Checks `evaluate`'s arguments before any work, and builds the tasks (loading their data).

    Args:
      output_dir: where the results go (must not be an existing file).
      optimizers: the optimizer specs (at least one).
      suite: a suite name, or None (then `tasks`).
      tasks: Tasks or TaskFamilies (at least one without a suite; none with one).
      num_steps: training steps per run of `tasks` (>= 1).
      num_seeds: task draws per task of `tasks` (>= 1).
      baselines: baseline names (each known).
      grids: {baseline: its learning-rate grid} (each used one non-empty, finite, > 0).
      momentum: SGD's momentum, in [0, 1).
      eval_split: a split of every task's data.
      max_extensions: >= 0.

    Returns:
      `[(name, TaskFamily, num_steps, seeds, eval_split)]` per task.
    """
    check_count(num_steps, "evaluate: num_steps (--num_steps)")
    check_count(num_seeds, "evaluate: num_seeds (--num_seeds)")
    unknown = [b for b in baselines if b not in protocol.baseline_names()]
    if unknown:
        raise ValueError(f"evaluate: unknown baselines {unknown} (--baselines); choose from {protocol.baseline_names()}")
    for name, grid in grids.items():
        check_learning_rates(grid, f"evaluate: {name}_lrs")
    if not 0.0 <= momentum < 1.0:
        raise ValueError(f"evaluate: momentum must be in [0, 1), got {momentum!r}")
    if isinstance(max_extensions, bool) or not isinstance(max_extensions, int) or max_extensions < 0:
        raise ValueError(f"evaluate: max_extensions must be an integer >= 0, got {max_extensions!r}")
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise ValueError(f"evaluate: output_dir {output_dir} is a file, not a directory")
    if not optimizers:
        raise ValueError("evaluate: no optimizer to evaluate; give --optimizer (a theta file, pretrained:NAME or "
                         f"one of {protocol.baseline_names()})")
    if suite is not None and tasks:
        raise ValueError(f"evaluate: give a suite (--suite {suite}) or tasks (--task), not both")
    if suite is not None:
        plan = []
        for t in suites.get(suite):
            try:
                family = t.build()
            except FileNotFoundError as e:
                raise ValueError(f"evaluate: suite {suite!r} task {t.name}: its data is missing: {e}") from None
            plan.append((t.name, family, t.num_steps, tuple(t.seeds), t.eval_split))
    else:
        if not tasks:
            raise ValueError("evaluate: no tasks; give --suite NAME (one of "
                             f"{suites.names()}) or --task 'QuadraticFamily(dim=4)' (or evaluate.tasks)")
        plan, seen = [], set()
        for t in tasks:
            family = single_task_family(t) if isinstance(t, Task) else t
            if not isinstance(family, TaskFamily):
                raise TypeError(f"evaluate.tasks must hold Tasks or TaskFamilies, got {type(t).__name__}")
            name = family.name if family.name not in seen else f"{family.name}_{len(plan)}"
            seen.add(name)
            plan.append((name, family, num_steps, tuple(range(num_seeds)), eval_split))
    for name, family, _, _, split in plan:
        if family.data is not None and split not in family.data.splits:
            raise ValueError(f"evaluate: eval_split {split!r} is not a split of {name}'s data "
                             f"(it has {sorted(family.data.splits)})")
    return plan


def task_bindings(specs: Sequence[str]) -> list[str]:
    """The gin bindings that make `--task` specs the evaluated tasks.

    "QuadraticFamily(dim=4)" as the first spec becomes the scoped binding
    `task0/QuadraticFamily.dim = 4`, and the specs together `evaluate.tasks = [@task0/QuadraticFamily(), ...]`.

    Args:
      specs: constructor calls of public tasks classes or functions, keyword arguments only; a bare name is
        a call without arguments.

    Returns:
      the bindings, the `evaluate.tasks` one last (none if `specs` is empty).

    Raises:
      SystemExit: a spec is not of the form `Name(key=value, ...)`.
    """
    bindings, refs = [], []
    for i, spec in enumerate(specs):
        try:
            call = ast.parse(spec.strip(), mode="eval").body
            if isinstance(call, ast.Name):
                call = ast.Call(func=call, args=[], keywords=[])
            if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name) or call.args:
                raise ValueError("expected Name(key=value, ...)")
            for kw in call.keywords:
                bindings.append(f"task{i}/{call.func.id}.{kw.arg} = {ast.unparse(kw.value)}")
        except (SyntaxError, ValueError) as e:
            raise SystemExit(f"error: bad --task {spec!r} ({e}); write e.g. 'QuadraticFamily(dim=4)'")
        refs.append(f"@task{i}/{call.func.id}()")
    return bindings + ([f"evaluate.tasks = [{', '.join(refs)}]"] if refs else [])


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """Parses the command line (`argv`, default `sys.argv[1:]`); see `--help`."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output_dir", required=True, help="where the result files go")
    p.add_argument("--suite", help=f"an evaluation suite of tasks.suites: {', '.join(suites.names())}")
    p.add_argument("--optimizer", action="append", default=[],
                   help="a theta file, an outer_train checkpoint file, pretrained:NAME, or a baseline name (adam, adamw, "
                        "sgdm); repeatable")
    p.add_argument("--theta", help="a theta_final.msgpack (the same as --optimizer PATH)")
    p.add_argument("--baselines", help="comma-separated tuned baselines (default adam,adamw,sgdm)")
    p.add_argument("--task", action="append", default=[], help="e.g. 'QuadraticFamily(dim=4)' (repeatable)")
    p.add_argument("--num_steps", type=int, help="steps per run of --task tasks (sets evaluate.num_steps)")
    p.add_argument("--num_seeds", type=int, help="task draws per --task task (sets evaluate.num_seeds)")
    p.add_argument("--gin_file", action="append", default=[], help="gin config file (repeatable)")
    p.add_argument("--gin_param", action="append", default=[], help="gin binding, e.g. 'evaluate.num_steps = 100'")
    p.add_argument("--stress_steps", type=int,
                   help="instead of the comparison, the stability check: each learned optimizer trains every task "
                        "this many steps (told this horizon); fails when a loss goes non-finite or ends above its start")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier evaluation's files in --output_dir")
    return p.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> dict:
    """Turns the command line (`argv`, default `sys.argv[1:]`) into gin bindings and runs `evaluate`.

    Returns:
      `evaluate`'s results.
    """
    args = parse_args(argv)
    params = list(args.gin_param) + task_bindings(args.task)
    specs = list(args.optimizer) + ([args.theta] if args.theta else [])
    if specs:
        params.append(f"evaluate.optimizers = {specs!r}")
    if args.suite:
        params.append(f"evaluate.suite = {args.suite!r}")
    if args.baselines is not None:
        names = [b.strip() for b in args.baselines.split(",") if b.strip()]
        params.append(f"evaluate.baselines = {names!r}")
    if args.overwrite:
        params.append("evaluate.overwrite = True")
    for flag in ("num_steps", "num_seeds"):
        if getattr(args, flag) is not None:
            params.append(f"evaluate.{flag} = {getattr(args, flag)}")
    if args.stress_steps is not None:
        if args.baselines is not None or args.num_steps is not None:
            raise SystemExit("error: --stress_steps replaces the comparison: it takes no --baselines or --num_steps")
        params = [p.replace("evaluate.", "stress.", 1) if p.startswith("evaluate.") else p for p in params]
        params.append(f"stress.stress_steps = {args.stress_steps}")
        load_config(args.gin_file, params)
        return stress(args.output_dir)
    load_config(args.gin_file, params)
    return evaluate(args.output_dir)


if __name__ == "__main__":
    if main().get("all_ok") is False:
        raise SystemExit(1)

"""Evaluating optimizers on a suite (or a list of tasks) against baselines tuned per task.

    out = evaluate("eval/", optimizers=["run/theta_final.msgpack"], suite="heldout-cpu", baselines=["adam"])

For every task (`task_plan.check_arguments`) and seed, every optimizer and every baseline trains
the same task draw from the same initialisation (`task_trainer.task_draws`); each baseline is tuned
over its learning-rate grid (`tuning.tune_learning_rate`), each learned optimizer runs once, told
the task's step budget (`optimizer_specs.run_learned`). Each optimizer is then scored against each
tuned baseline's best run (`scores.compare_runs`, `scores.summarize`: wins, IQMs of the loss
ratios and speedups). `output_dir` receives RESULT_FILES:

    results.json  everything, machine-readable (non-finite numbers as null, with flags)
    results.md    the summary table and the per-task tables
    results.csv   task, optimizer, learning_rate, seed, final_train_loss, eval_loss for every run
    curves.png    per task: train-loss curves (median over seeds, min-max band) of each optimizer
                  and each baseline at its best rate
    curves.npz    every curve, [seeds, steps] per (task, optimizer, lr)

and an earlier evaluation's files are never replaced unless `overwrite`.
"""
from __future__ import annotations

import functools
import os
import resource
import time
from typing import Any, Callable, Optional, Sequence

from outer_trainers.evaluation.curves import plot_curves, save_curves
from outer_trainers.evaluation.optimizer_specs import optimizer_labels, resolve_optimizer, run_learned
from outer_trainers.evaluation.report import results_json, results_markdown, write_csv, write_json, write_text
from outer_trainers.evaluation.scores import compare_runs, summarize
from outer_trainers.evaluation.task_plan import check_arguments
from outer_trainers.evaluation.task_trainer import task_draws
from outer_trainers.evaluation.tuning import baseline, best_runs, default_lrs, tune_learning_rate
from tasks.base import TaskFamily
from tasks.conv import ConvFamily

RESULT_FILES = ("results.csv", "curves.png", "results.md", "curves.npz", "results.json")
ADAM_LRS, ADAMW_LRS, SGDM_LRS = default_lrs("adam"), default_lrs("adamw"), default_lrs("sgdm")
Log = Optional[Callable[[str], None]]
print_now = functools.partial(print, flush=True)


def runs_in_sequence(family: TaskFamily) -> bool:
    """Whether a task's rates and seeds run one after another inside each program (convnets: on
    CPU a vmap over their weights becomes a slower grouped convolution) rather than vmapped.

    Args:
      family: the task family.

    Returns:
      True for a `tasks.ConvFamily`.
    """
    return isinstance(family, ConvFamily)


def run_task(family: TaskFamily, num_steps: int, seeds: Sequence[int], optimizers: Sequence[dict],
             baselines: Sequence[str], grids: dict, eval_split: str, *, momentum: float = 0.9,
             weight_decay: float = 1e-2, max_extensions: int = 4) -> tuple[list[dict], dict]:
    """Trains one task per seed with every optimizer and every baseline (tuned: `tune_learning_rate`).

    Every setting sees the same task draws and initialisations (`task_draws`). A baseline given
    as an optimizer under its own name is tuned once, not twice.

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
    common = dict(eval_split=eval_split, sequential=runs_in_sequence(family))
    runs, seconds, tuned = [], {}, set()

    def tune(label, name):
        make_tx = baseline(name, momentum=momentum, weight_decay=weight_decay)
        return tune_learning_rate(family, label, make_tx, grids[name], cfgs, run_keys, num_steps,
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


def _cpu_seconds() -> float:
    """User + system CPU time of this process so far (all threads), in seconds."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def evaluate(output_dir: str, *, optimizers: Sequence[str] = (), theta_path: Optional[str] = None,
             suite: Optional[str] = None, tasks: Sequence[Any] = (), num_steps: int = 1000, num_seeds: int = 3,
             baselines: Sequence[str] = ("adam", "adamw", "sgdm"), adam_lrs: Sequence[float] = ADAM_LRS,
             adamw_lrs: Sequence[float] = ADAMW_LRS, sgdm_lrs: Sequence[float] = SGDM_LRS, momentum: float = 0.9,
             weight_decay: float = 1e-2, eval_split: str = "test", max_extensions: int = 4,
             overwrite: bool = False, log: Log = print_now) -> dict:
    """Runs the evaluation of the module docstring and writes its five files to `output_dir`.

    Per optimizer L and tuned baseline B, over the tasks: wins (f_L < f_B, e_L < e_B, speedup > 1)
    and interquartile means of f_L / f_B, e_L / e_B and the speedups (`scores`).

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
      log: receives each task's progress line and, at the end, results.md's text (None: silent).

    Returns:
      `{"results": {task: runs}, "comparisons": ..., "summary": ..., "json": results.json's content}`.

    Raises:
      ValueError (TypeError for a task of another type), before any training or file is written,
      naming the argument: see `check_arguments`.
    """
    log = log or (lambda text: None)
    specs = list(optimizers) + ([theta_path] if theta_path else [])
    plan = check_arguments(output_dir, specs, suite, tasks, num_steps, num_seeds, baselines,
                           {"adam": adam_lrs, "adamw": adamw_lrs, "sgdm": sgdm_lrs}, momentum, eval_split,
                           max_extensions)
    existing = [f for f in RESULT_FILES if os.path.exists(os.path.join(output_dir, f))]
    if existing and not overwrite:
        raise ValueError(f"evaluate: {output_dir} already holds the results of an evaluation ({', '.join(existing)}); "
                         f"choose another --output_dir or pass --overwrite to replace them")
    opts = [resolve_optimizer(s, label) for s, label in zip(specs, optimizer_labels(specs))]
    grids = {"adam": tuple(adam_lrs), "adamw": tuple(adamw_lrs), "sgdm": tuple(sgdm_lrs)}
    results, info, start, cpu_start = {}, {}, time.perf_counter(), _cpu_seconds()
    for name, family, steps, seeds, split in plan:
        runs, seconds = run_task(family, steps, seeds, opts, baselines, grids, split, momentum=momentum,
                                 weight_decay=weight_decay, max_extensions=max_extensions)
        results[name] = runs
        info[name] = {"num_steps": steps, "seeds": list(seeds), "eval_split": split, "seconds": seconds}
        log(f"{name}: {steps} steps x {len(seeds)} seeds in {sum(seconds.values()):.0f} s")
    total, cpu = time.perf_counter() - start, _cpu_seconds() - cpu_start
    comparisons, summary = {}, {}
    for opt in opts:
        for base in baselines:
            if opt["label"] == base:
                continue
            pair = f"{opt['label']} vs {base}"
            comparisons[pair] = {t: compare_runs(best_runs(runs)[opt["label"]], best_runs(runs)[base])
                                 for t, runs in results.items()}
            summary[pair] = summarize(comparisons[pair])
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
    save_curves(os.path.join(output_dir, "curves.npz"), results)
    write_json(os.path.join(output_dir, "results.json"), doc)
    what = f"suite {suite}" if suite else f"{len(results)} tasks"
    title = f"{', '.join(o['label'] for o in opts)} vs tuned {', '.join(baselines)} on {what}"
    text = results_markdown(title, comparisons, summary, results, {t: i["num_steps"] for t, i in info.items()},
                            total, cpu)
    write_text(os.path.join(output_dir, "results.md"), text)
    log(text)
    return {"results": results, "comparisons": comparisons, "summary": summary, "json": doc}

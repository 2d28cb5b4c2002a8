#!/usr/bin/env python
"""Evaluate a meta-trained optimizer against tuned baselines on a list of tasks.

    python scripts/evaluate.py --theta run/theta_final.msgpack --task "QuadraticFamily(dim=10)" \
        --task "ImageMLPFamily(hidden_sizes=(32,))" --num_steps 500 --num_seeds 3 --output_dir eval/
    python scripts/evaluate.py --gin_file my_eval.gin --output_dir eval/     # evaluate.tasks = [...]

Each task (a Task or TaskFamily; a family draws one task per seed) is trained for `num_steps`
steps with the learned optimizer and with Adam and SGD with momentum, each over a 7-point
log-spaced learning-rate grid, for every seed (same task draws and initialisations for every
optimizer). Writes to output_dir:

    results.csv   task, optimizer, learning_rate, seed, final_train_loss, eval_loss
                  (final = mean train loss over the last 10% of steps)
    curves.png    per task: train-loss curves, median over seeds with the min–max band, of the
                  learned optimizer and the best-tuned Adam and SGD-momentum (best lr: lowest
                  median final train loss over seeds, a diverged seed loses; `best_runs` of
                  outer_trainers.evaluation)
    results.md    Markdown table of the same comparison
    curves.npz    the curves, [seeds, steps] per (task, optimizer, lr)

A `--task` is a gin-style constructor call of a public tasks class, e.g. "QuadraticFamily(dim=4)".
Every argument is checked before any training or file is written (`check_arguments`). An optimizer
whose every setting diverged is reported at its first one, marked "(every setting diverged)".
"""
from __future__ import annotations

import argparse
import ast
import csv
import os
from typing import Any, Optional, Sequence

import gin
import jax
import numpy as np
import optax

import lopt
from lopt.file_io import atomic_write_bytes
from outer_trainers.evaluation import best_runs, check_learning_rates, final_loss, lr_grid, run_settings
from outer_trainers.gin_registry import load_config  # importing gin_registry registers the public API with gin
from tasks.base import Task, TaskFamily, check_count, single_task_family

RESULT_FILES = ("results.csv", "curves.png", "results.md", "curves.npz")
ADAM_LRS = tuple(float(x) for x in np.logspace(-4, -1, 7))
SGDM_LRS = tuple(float(x) for x in np.logspace(-3, 0, 7))


def run_task(family: TaskFamily, learned_opt: lopt.LearnedOptimizer, theta: Any, num_steps: int,
             seeds: Sequence[int], adam_lrs: Sequence[float], sgdm_lrs: Sequence[float], momentum: float,
             eval_split: str) -> list[dict]:
    """Trains one draw of `family` per seed with the learned optimizer and both baselines' lr grids.

    Every setting sees the same task draws and initialisations; one compile per optimizer.

    Args:
      family: the task family (a Task lifted by `single_task_family` draws the same task every seed).
      learned_opt: the learned optimizer's architecture.
      theta: its meta-parameters.
      num_steps: inner training steps per run (also the learned optimizer's horizon).
      seeds: one task draw and run key per seed.
      adam_lrs: Adam's learning-rate grid.
      sgdm_lrs: SGD-with-momentum's learning-rate grid.
      momentum: SGD's momentum.
      eval_split: the data split of the loss measured after training.

    Returns:
      `run_settings`'s list, "learned" first: `{"optimizer", "learning_rate" (NaN for the learned
      optimizer), "losses" [S, num_steps], "evals" [S]}` in float64, S = len(seeds).
    """
    keys = [jax.random.key(s) for s in seeds]
    cfgs = jax.vmap(family.sample)(jax.numpy.stack([jax.random.fold_in(k, 0) for k in keys]))
    run_keys = jax.numpy.stack([jax.random.fold_in(k, 1) for k in keys])
    settings = [("learned", lambda th: learned_opt.opt_fn(th, num_steps=num_steps), [(float("nan"), theta)]),
                ("adam", optax.adam, lr_grid(adam_lrs)),
                ("sgdm", lambda lr: optax.sgd(lr, momentum=momentum), lr_grid(sgdm_lrs))]
    runs = run_settings(family, settings, cfgs, run_keys, num_steps, eval_split=eval_split)
    for r in runs:
        r["losses"], r["evals"] = r["losses"].astype(np.float64), r["evals"].astype(np.float64)
    return runs


def write_csv(path: str, results: dict, seeds: Sequence[int]) -> None:
    """Writes every run of every task, one row per seed, to a CSV file.

    Args:
      path: the CSV file to write.
      results: `{task name: run_task's runs}`.
      seeds: the seeds of the runs' rows.
    """
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["task", "optimizer", "learning_rate", "seed", "final_train_loss", "eval_loss"])
        for task, runs in results.items():
            for r in runs:
                lr = "" if np.isnan(r["learning_rate"]) else f"{r['learning_rate']:.6g}"
                finals = final_loss(r["losses"])
                for i, s in enumerate(seeds):
                    w.writerow([task, r["optimizer"], lr, s, f"{finals[i]:.6g}", f"{r['evals'][i]:.6g}"])


DIVERGED = " (every setting diverged)"  # marks a best_runs entry that won only because all diverged


def lr_label(run: dict) -> str:
    """How a best run's learning rate is reported: "—" for the learned optimizer, `DIVERGED` added
    when `best_runs` found no setting that did not diverge.

    Args:
      run: a `best_runs` entry.

    Returns:
      e.g. "0.001", "—", "0.0001 (every setting diverged)".
    """
    lr = "—" if np.isnan(run["learning_rate"]) else f"{run['learning_rate']:.3g}"
    return lr + (DIVERGED if run.get("diverged") else "")


def markdown_table(results: dict, num_steps: int) -> str:
    """A Markdown table of each task's learned optimizer and best-tuned baselines (`best_runs`).

    Args:
      results: `{task name: run_task's runs}`.
      num_steps: the inner steps of the runs (shown in the caption).

    Returns:
      a caption and the table: per task and optimizer, the best lr (`lr_label`) and the final
      train loss (median [min, max] over seeds) and median eval loss.
    """
    lines = ["| task | optimizer | best lr | final train loss, median [min, max] over seeds | eval loss (median) |",
             "|---|---|---|---|---|"]
    for task, runs in results.items():
        for name, r in best_runs(runs).items():
            fin = final_loss(r["losses"])
            lines.append(f"| {task} | {name} | {lr_label(r)} | {np.median(fin):.4g} "
                         f"[{np.min(fin):.4g}, {np.max(fin):.4g}] | {np.median(r['evals']):.4g} |")
    return f"Final losses after {num_steps} steps; baselines at their best learning rate.\n\n" + "\n".join(lines)


def plot_curves(path: str, results: dict) -> None:
    """Plots, per task, the train-loss curves of the learned optimizer and the best-tuned baselines.

    Each curve is the median over seeds with a min–max band; the y axis is clipped at 10× the
    largest median starting loss (so diverging curves do not squash the others) and is
    logarithmic when every finite run's losses are positive.

    Args:
      path: the PNG file to write.
      results: `{task name: run_task's runs}`.
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    n = len(results)
    fig, axes = plt.subplots(1, n, figsize=(5 * n, 4), squeeze=False)
    for ax, (task, runs) in zip(axes[0], results.items()):
        for name, r in best_runs(runs).items():
            losses = r["losses"]
            steps = np.arange(1, losses.shape[1] + 1)
            label = name if np.isnan(r["learning_rate"]) else f"{name} (lr={r['learning_rate']:.2g})"
            label += DIVERGED if r.get("diverged") else ""
            ax.plot(steps, np.median(losses, 0), label=label)
            ax.fill_between(steps, np.min(losses, 0), np.max(losses, 0), alpha=0.2)
        if all(np.all(np.asarray(r["losses"]) > 0) for r in runs if np.all(np.isfinite(r["losses"]))):
            ax.set_yscale("log")  # before the limit below, which a linear axis would set below 0
        starts = [np.median(r["losses"][:, 0]) for r in runs if np.all(np.isfinite(r["losses"][:, 0]))]
        if starts and np.isfinite(max(starts)):  # keep diverging curves from squashing the others
            ax.set_ylim(top=max(10 * max(starts), 1e-12) if max(starts) > 0 else None)
        ax.set_title(task)
        ax.set_xlabel("step")
        ax.set_ylabel("train loss")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


@gin.configurable
def evaluate(output_dir: str, *, theta_path: str = gin.REQUIRED, tasks: Sequence[Any] = gin.REQUIRED,
             num_steps: int = 1000, num_seeds: int = 3, adam_lrs: Sequence[float] = ADAM_LRS,
             sgdm_lrs: Sequence[float] = SGDM_LRS, momentum: float = 0.9, eval_split: str = "test",
             overwrite: bool = False) -> dict:
    """Runs the comparison of the module docstring and writes its four files to `output_dir`.

    Args:
      output_dir: where results.csv, curves.png, results.md and curves.npz go (created if missing).
      theta_path: a learned optimizer's theta file (`lopt.save_theta`).
      tasks: Tasks or TaskFamilies; a repeated name gets its index appended.
      num_steps: inner training steps per run.
      num_seeds: task draws (and run keys) per task, seeds 0 .. num_seeds - 1.
      adam_lrs: Adam's learning-rate grid.
      sgdm_lrs: SGD-with-momentum's learning-rate grid.
      momentum: SGD's momentum.
      eval_split: the data split of the loss measured after training.
      overwrite: replace the result files of an earlier evaluation in `output_dir` (otherwise refused).

    Returns:
      `{task name: run_task's runs}`.

    Raises:
      ValueError (TypeError for a task of another type), before any training or file is written,
      naming the argument: num_steps or num_seeds < 1, no tasks, an empty or non-positive lr grid,
      momentum outside [0, 1), an eval_split a task's data lacks, an output_dir that is a file or
      already holds an evaluation's results (unless `overwrite`), or an invalid theta file.
    """
    families = check_arguments(output_dir, tasks, num_steps, num_seeds, adam_lrs, sgdm_lrs, momentum, eval_split)
    existing = [f for f in RESULT_FILES if os.path.exists(os.path.join(output_dir, f))]
    if existing and not overwrite:
        raise ValueError(f"evaluate: {output_dir} already holds the results of an evaluation ({', '.join(existing)}); "
                         f"choose another --output_dir or pass --overwrite to replace them")
    learned_opt, theta = lopt.load_learned_optimizer(theta_path)
    seeds = list(range(num_seeds))
    results = {}
    for family in families:
        name = family.name if family.name not in results else f"{family.name}_{len(results)}"
        results[name] = run_task(family, learned_opt, theta, num_steps, seeds, adam_lrs, sgdm_lrs, momentum,
                                 eval_split)
    os.makedirs(output_dir, exist_ok=True)
    write_csv(os.path.join(output_dir, "results.csv"), results, seeds)
    plot_curves(os.path.join(output_dir, "curves.png"), results)
    table = markdown_table(results, num_steps)
    atomic_write_bytes(os.path.join(output_dir, "results.md"),
                       f"# Learned optimizer ({learned_opt.name}) vs tuned baselines\n\n{table}\n".encode("utf-8"))
    np.savez(os.path.join(output_dir, "curves.npz"),
             **{f"{t}/{r['optimizer']}/{r['learning_rate']:.6g}": r["losses"] for t, runs in results.items()
                for r in runs})
    print(table)
    return results


def check_arguments(output_dir: str, tasks: Sequence[Any], num_steps: int, num_seeds: int,
                    adam_lrs: Sequence[float], sgdm_lrs: Sequence[float], momentum: float,
                    eval_split: str) -> list[TaskFamily]:
    """Checks `evaluate`'s arguments (see its Raises) before any work.

    Args:
      output_dir: where the results go (must not be an existing file).
      tasks: Tasks or TaskFamilies (at least one).
      num_steps: inner training steps per run (>= 1).
      num_seeds: task draws per task (>= 1).
      adam_lrs: Adam's learning-rate grid (non-empty, finite, > 0).
      sgdm_lrs: SGD-with-momentum's learning-rate grid (non-empty, finite, > 0).
      momentum: SGD's momentum, in [0, 1).
      eval_split: a split of every task's data.

    Returns:
      the tasks as TaskFamilies (a Task lifted by `single_task_family`).
    """
    check_count(num_steps, "evaluate: num_steps (--num_steps)")
    check_count(num_seeds, "evaluate: num_seeds (--num_seeds)")
    check_learning_rates(adam_lrs, "evaluate: adam_lrs")
    check_learning_rates(sgdm_lrs, "evaluate: sgdm_lrs")
    if not 0.0 <= momentum < 1.0:
        raise ValueError(f"evaluate: momentum must be in [0, 1), got {momentum!r}")
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise ValueError(f"evaluate: output_dir {output_dir} is a file, not a directory")
    if not tasks:
        raise ValueError("evaluate: no tasks; give at least one (--task 'QuadraticFamily(dim=4)' or evaluate.tasks)")
    families = []
    for t in tasks:
        family = single_task_family(t) if isinstance(t, Task) else t
        if not isinstance(family, TaskFamily):
            raise TypeError(f"evaluate.tasks must hold Tasks or TaskFamilies, got {type(t).__name__}")
        if family.data is not None and eval_split not in family.data.splits:
            raise ValueError(f"evaluate: eval_split {eval_split!r} is not a split of {family.name}'s data "
                             f"(it has {sorted(family.data.splits)})")
        families.append(family)
    return families


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
    p.add_argument("--output_dir", required=True, help="where results.csv, curves.png, results.md, curves.npz go")
    p.add_argument("--theta", help="a theta_final.msgpack (sets evaluate.theta_path)")
    p.add_argument("--task", action="append", default=[], help="e.g. 'QuadraticFamily(dim=4)' (repeatable)")
    p.add_argument("--num_steps", type=int, help="inner steps per run (sets evaluate.num_steps)")
    p.add_argument("--num_seeds", type=int, help="task draws per task (sets evaluate.num_seeds)")
    p.add_argument("--gin_file", action="append", default=[], help="gin config file (repeatable)")
    p.add_argument("--gin_param", action="append", default=[], help="gin binding, e.g. 'evaluate.num_steps = 100'")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier evaluation's files in --output_dir")
    return p.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> dict:
    """Turns the command line (`argv`, default `sys.argv[1:]`) into gin bindings and runs `evaluate`.

    Returns:
      `evaluate`'s results.
    """
    args = parse_args(argv)
    params = list(args.gin_param) + task_bindings(args.task)
    if args.theta:
        params.append(f"evaluate.theta_path = {args.theta!r}")
    if args.overwrite:
        params.append("evaluate.overwrite = True")
    for flag in ("num_steps", "num_seeds"):
        if getattr(args, flag) is not None:
            params.append(f"evaluate.{flag} = {getattr(args, flag)}")
    load_config(args.gin_file, params)
    return evaluate(args.output_dir)


if __name__ == "__main__":
    main()

"""The stability check: learned optimizers trained far past their meta-training horizons.

    doc = stress_test("st/", stress_steps=8000, optimizers=["pretrained:normmlp_v3"], suite="heldout-cpu")
    doc["all_ok"]   # False when any seed of any task failed

Every learned optimizer trains every task of a suite (or a list of tasks) once per seed for
`stress_steps` steps, told that horizon, with the same task draws as `suite_runs.evaluate`. A seed
passes `scores.stability`'s check: every loss finite,

    final train loss (mean of the last 10% of steps) < initial train loss (mean of the first 1%),

and not collapsed: final train loss < (1 - margin) x the task's trivial loss, when the task declares
one (an optional `trivial_loss` of the Task: the loss of the best input-independent predictor, e.g.
predicting the mean output; `scores.trivial_loss_of`; margin 0.05). Passing says the optimizer
does not diverge or collapse, not that it trains well that long. `output_dir`
receives STRESS_FILES (stress.json, stress.md: per task, optimizer and seed, the initial, final
and highest train loss, the held-out loss, the trivial loss, pass, "collapsed" or fail).
"""
from __future__ import annotations

import os
import time
from typing import Any, Optional, Sequence

from outer_trainers.evaluation.optimizer_specs import optimizer_labels, resolve_optimizer, run_learned
from outer_trainers.evaluation.report import format_number, json_safe, write_json, write_text
from outer_trainers.evaluation.scores import COLLAPSE_MARGIN, stability
from outer_trainers.evaluation.suite_runs import Log, print_now, trivial_losses
from outer_trainers.evaluation.task_plan import check_arguments
from outer_trainers.evaluation.task_trainer import task_draws
from outer_trainers.evaluation.tuning import baseline_names

STRESS_FILES = ("stress.json", "stress.md")


def stress_test(output_dir: str, *, stress_steps: int, optimizers: Sequence[str] = (),
                theta_path: Optional[str] = None, suite: Optional[str] = None, tasks: Sequence[Any] = (),
                num_seeds: int = 3, eval_split: str = "test", collapse_margin: float = COLLAPSE_MARGIN,
                overwrite: bool = False, log: Log = print_now) -> dict:
    """The stability check: every learned optimizer trains every task for `stress_steps` steps.

    Each optimizer is told the horizon `stress_steps` (as a user would call `opt_fn(theta,
    num_steps=...)` or `lopt.pretrained.load(name, num_steps=...)`) and trains each task once per
    seed (the suite's seeds, or `num_seeds` of `tasks`), with the same draws as `evaluate`. A seed
    passes when its losses stay finite, its final train loss ends below its initial one and it did
    not collapse to its task's trivial loss (`stability`). Meant for horizons past the meta-training
    ones (4x, say) and for tasks wider than any meta-training task. Writes stress.json and stress.md.

    Args:
      output_dir: where the two files go (created if missing).
      stress_steps: the training steps (and horizon) of every run (>= 1).
      optimizers: learned optimizers: theta or checkpoint file paths, or "pretrained:NAME".
      theta_path: one more theta file.
      suite: a `tasks.suites` name; its tasks bring their seeds and eval split (not their budgets).
      tasks: Tasks or TaskFamilies instead of a suite.
      num_seeds: task draws per task of `tasks`.
      eval_split: the data split of the held-out loss of `tasks`.
      collapse_margin: `scores.collapsed`'s margin.
      overwrite: replace the files of an earlier stability check in `output_dir` (otherwise refused).
      log: receives a line per task and optimizer and the verdict (None: silent).

    Returns:
      `{"stress_steps", "optimizers", "tasks": {task: {optimizer: stability(...)}}, "failures":
      ["task / optimizer"], "all_ok"}` (also stress.json's content).

    Raises:
      ValueError: as `check_arguments`, or a baseline among `optimizers` (a baseline needs a tuned rate).
    """
    log = log or (lambda text: None)
    num = format_number
    specs = list(optimizers) + ([theta_path] if theta_path else [])
    plan = check_arguments(output_dir, specs, suite, tasks, stress_steps, num_seeds, (), {}, 0.9, eval_split)
    baselines = [s for s in specs if s in baseline_names()]
    if baselines:
        raise ValueError(f"evaluate: the stability check (--stress_steps) runs learned optimizers only; {baselines} "
                         f"are baselines, which need a tuned learning rate (use the comparison instead)")
    existing = [f for f in STRESS_FILES if os.path.exists(os.path.join(output_dir, f))]
    if existing and not overwrite:
        raise ValueError(f"evaluate: {output_dir} already holds a stability check ({', '.join(existing)}); "
                         f"choose another --output_dir or pass --overwrite to replace it")
    opts = [resolve_optimizer(s, label) for s, label in zip(specs, optimizer_labels(specs))]
    out, failures, start = {}, [], time.perf_counter()
    rows = ["| task | optimizer | seed | initial | final | max | held-out | trivial loss | |",
            "|---|---|---|---|---|---|---|---|---|"]
    for name, family, _, seeds, split in plan:
        cfgs, run_keys = task_draws(family, seeds)
        trivial = trivial_losses(family, seeds)
        out[name] = {}
        for opt in opts:
            t0 = time.perf_counter()
            run = run_learned(opt, family, stress_steps, cfgs, run_keys, eval_split=split, valid_split=split,
                              sequential=True)  # long runs: one seed at a time keeps memory flat; no tuning here
            st = stability(run, trivial, collapse_margin)
            out[name][opt["label"]] = {**st, "seeds": list(seeds), "seconds": time.perf_counter() - t0}
            if not st["all_ok"]:
                failures.append(f"{name} / {opt['label']}")
            for i, seed in enumerate(seeds):
                flat = st["collapsed"][i] and st["trivial_loss"][i] is not None
                verdict = "ok" if st["ok"][i] else "**collapsed**" if flat else "**FAIL**"
                rows.append(f"| {name} | {opt['label']} | {seed} | {num(st['initial'][i], '.4g')} | "
                            f"{num(st['final'][i], '.4g')} | {num(st['max'][i], '.4g')} | {num(st['eval'][i], '.4g')} "
                            f"| {num(st['trivial_loss'][i], '.4g')} | {verdict} |")
            log(f"{name} / {opt['label']}: {'ok' if st['all_ok'] else 'FAIL'} (final {num(max(st['final']), '.4g')}, "
                f"initial {num(min(st['initial']), '.4g')}) in {time.perf_counter() - t0:.0f} s")
    doc = json_safe({"stress_steps": stress_steps, "suite": suite, "optimizers": {o["label"]: o["spec"] for o in opts},
                     "tasks": out, "failures": failures, "all_ok": not failures,
                     "seconds": time.perf_counter() - start})
    os.makedirs(output_dir, exist_ok=True)
    write_json(os.path.join(output_dir, "stress.json"), doc)
    verdict = "Every run passed" if not failures else f"FAILED: {', '.join(failures)}"
    text = (f"# Stability check: {stress_steps} steps\n\nEach optimizer told the horizon {stress_steps}; a seed "
            f"passes when its losses stay finite, the final train loss (mean of the last 10% of steps) is below "
            f"the initial one (mean of the first 1%), and, where the task declares a trivial loss (the loss of the "
            f"best input-independent predictor), below {1 - collapse_margin:g}x that (else **collapsed**). "
            f"{verdict}.\n\n" + "\n".join(rows) + "\n")
    write_text(os.path.join(output_dir, "stress.md"), text)
    log(verdict)
    return doc

#!/usr/bin/env python
"""The two-stage tuning rule against the full grid: does it choose the full grid's setting, and what does each cost?

    python scripts/compare_tuning.py --suite validation-cpu --spec adamw:tuned --output_dir /tmp/tuning_cmp
    python scripts/compare_tuning.py --suite heldout-cpu --modes two_stage --output_dir /tmp/tuning_cost

For every task of the suite (or `--only` the named ones), the baseline spec is tuned on the task's
seeds by `outer_trainers.evaluation.baselines.tune_spec` twice, with the protocol's
`BaselineTuning()` in both but its rule: "two_stage" (one seed over the whole grid, extended at its
edges, then every seed at the 3 best points: the protocol's rule) and "full" (`top_k=None`: every
seed at every point and every extension). Both choose on the median final validation loss over
seeds (`tuning.best_runs`). Per task it reports each mode's choice (rate, weight decay, schedule),
whether they agree, the ratio of the two choices' median final validation losses and median test
losses (two-stage over full, 1 when they agree; both measured on every seed) and each mode's wall and
process CPU seconds (compilation included). The agreement count is the bar of issue 58 ("agrees with the full grid's
choice on >= 5 of 6 validation-cpu tasks").

Each task and mode is tuned in a fresh Python process (unless --in_process), so that each mode's
seconds include its own compilations and neither reuses the other's. Writes, under --output_dir, one
JSON per finished task (tasks/NAME.json: a rerun skips finished tasks)
and, at the end, comparison.json and comparison.md (the table).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from typing import Optional, Sequence

import numpy as np

from outer_trainers.evaluation.baselines import STAGE1_SEEDS, TOP_K, BaselineTuning, tune_spec
from outer_trainers.evaluation.suite_runs import runs_in_sequence
from outer_trainers.evaluation.task_plan import plan_tasks
from outer_trainers.evaluation.task_trainer import task_draws
from outer_trainers.evaluation.tuning import best_runs

MODES = ("two_stage", "full")


def cpu_seconds() -> float:
    """The CPU seconds (user + system) this process and its finished children have used."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def tuning_of(mode: str, top_k: int = TOP_K, stage1_seeds: int = STAGE1_SEEDS) -> BaselineTuning:
    """The protocol's `BaselineTuning()` with the rule `mode`: "two_stage" (its default, or `top_k` points and
    `stage1_seeds` seeds) or "full" (top_k=None)."""
    if mode not in MODES:
        raise ValueError(f"compare_tuning: unknown mode {mode!r}; the modes are {list(MODES)}")
    two_stage = mode == "two_stage"
    tuning = BaselineTuning(top_k=top_k, stage1_seeds=stage1_seeds) if two_stage else BaselineTuning(top_k=None)
    tuning.check()
    return tuning


def setting(run: dict) -> dict:
    """A run's grid point and its scores: rate, decay, schedule, median final validation and test loss over seeds
    (and each seed's, "valids" and "tests")."""
    med = lambda k: float(np.median(np.asarray(run[k], np.float64)))
    return {"learning_rate": float(run["learning_rate"]), "weight_decay": float(run["weight_decay"]),
            "schedule": run["schedule"], "valid": med("valids"), "test": med("evals"),
            "valids": [float(v) for v in run["valids"]], "tests": [float(v) for v in run["evals"]],
            "diverged": bool(run.get("diverged", False)), "grid_edge": run.get("grid_edge")}


def tune_task(planned, spec: str, tuning: BaselineTuning) -> dict:
    """One task tuned by one mode: its choice, its runs' count and its wall and CPU seconds.

    Args:
      planned: a `task_plan.PlannedTask`.
      spec: the baseline spec (e.g. "adamw:tuned").
      tuning: the rule (`tuning_of`).

    Returns:
      {"choice": `setting` of the best run, "points": the last stage's points (the full grid's size with
      its extensions for "full", `top_k` for "two_stage"), "seeds", "wall_s", "cpu_s", "settings": every
      last-stage point's `setting`}.
    """
    cfgs, keys = task_draws(planned.family, planned.seeds)
    wall, cpu = time.perf_counter(), cpu_seconds()
    runs = tune_spec(planned.family, spec, tuning, planned.num_steps, cfgs, keys,
                     eval_split=planned.eval_split, sequential=runs_in_sequence(planned.family))
    wall, cpu = time.perf_counter() - wall, cpu_seconds() - cpu
    best = best_runs(runs)[spec]
    return {"choice": setting(best), "points": len(runs), "seeds": len(planned.seeds), "wall_s": wall, "cpu_s": cpu,
            "settings": [setting(r) for r in runs]}


def compare(result: dict) -> dict:
    """Whether two-stage chose the full grid's point, and the losses' ratios (two-stage over full; 1 if equal)."""
    a, b = result["two_stage"]["choice"], result["full"]["choice"]
    key = lambda c: (c["learning_rate"], c["weight_decay"], c["schedule"])
    agree = key(a) == key(b)
    return {"agree": agree, "valid_ratio": 1.0 if agree else a["valid"] / b["valid"],
            "test_ratio": 1.0 if agree else a["test"] / b["test"]}


def table(results: dict, spec: str, suite: str) -> str:
    """The comparison as markdown: one row per task, the agreement count and the costs' totals."""
    fmt = lambda c: f"{c['learning_rate']:.3g}, {c['weight_decay']:.3g}, {c['schedule']}"
    lines = [f"# {spec}: two-stage tuning against the full grid on {suite}", "",
             "| task | two-stage (lr, wd, schedule) | full grid | agree | valid ratio | test ratio | "
             "two-stage wall s / CPU s | full wall s / CPU s |", "|---|---|---|---|---|---|---|---|"]
    modes = [m for m in MODES if all(m in r for r in results.values())]
    for name, r in results.items():
        if len(modes) == 2:
            c = compare(r)
            lines.append(f"| {name} | {fmt(r['two_stage']['choice'])} | {fmt(r['full']['choice'])} | "
                         f"{'yes' if c['agree'] else 'no'} | {c['valid_ratio']:.4f} | {c['test_ratio']:.4f} | "
                         f"{r['two_stage']['wall_s']:.0f} / {r['two_stage']['cpu_s']:.0f} | "
                         f"{r['full']['wall_s']:.0f} / {r['full']['cpu_s']:.0f} |")
        else:
            m = modes[0]
            lines.append(f"| {name} | {fmt(r[m]['choice']) if m == 'two_stage' else ''} | "
                         f"{fmt(r[m]['choice']) if m == 'full' else ''} | | | | "
                         f"{r[m]['wall_s']:.0f} / {r[m]['cpu_s']:.0f} | |")
    lines.append("")
    if len(modes) == 2:
        agree = sum(compare(r)["agree"] for r in results.values())
        lines.append(f"Agreement: {agree} of {len(results)} tasks.")
    for m in modes:
        w = sum(r[m]["wall_s"] for r in results.values())
        c = sum(r[m]["cpu_s"] for r in results.values())
        lines.append(f"{m}: {w / 60:.1f} wall-min, {c / 60:.1f} CPU-min over {len(results)} tasks.")
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> dict:
    """Runs the comparison (module docstring) and writes its files; returns {task: {mode: ...}}."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output_dir", required=True)
    p.add_argument("--suite", default="validation-cpu")
    p.add_argument("--spec", default="adamw:tuned", help="a tuned baseline spec NAME[:SCHEDULE]")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {list(MODES)}")
    p.add_argument("--only", action="append", default=[], help="a task name of the suite (repeatable; default all)")
    p.add_argument("--top_k", type=int, default=TOP_K, help="the two-stage rule's stage-2 points")
    p.add_argument("--stage1_seeds", type=int, default=STAGE1_SEEDS, help="the two-stage rule's stage-1 seeds")
    p.add_argument("--in_process", action="store_true",
                   help="tune in this process (default: each task and mode in a fresh process, so that neither mode "
                        "reuses the other's compilations and the costs compare)")
    args = p.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    rules = {m: tuning_of(m, args.top_k, args.stage1_seeds) for m in modes}
    described = {m: rules[m].describe()["two_stage"] for m in modes}
    plan = plan_tasks(args.suite, (), 1, 1, "test", what="compare_tuning")
    if args.only:
        unknown = sorted(set(args.only) - {t.name for t in plan})
        if unknown:
            raise SystemExit(f"error: --only {unknown}: not tasks of {args.suite} ({[t.name for t in plan]})")
        plan = [t for t in plan if t.name in args.only]
    os.makedirs(os.path.join(args.output_dir, "tasks"), exist_ok=True)
    results = {}
    for t in plan:
        path = os.path.join(args.output_dir, "tasks", f"{t.name}.json")
        done = json.load(open(path)) if os.path.exists(path) else {}
        for m in modes:
            if m in done and done[m].get("rule", tuning_of(m).describe()["two_stage"]) != described[m]:
                raise SystemExit(f"error: {path} holds {m} by another rule ({done[m].get('rule')!r}, not "
                                 f"{described[m]!r}): give another --output_dir")
            if m not in done and not args.in_process:
                print(f"{t.name}: {m} ... (a fresh process)", flush=True)
                subprocess.run([sys.executable, os.path.abspath(__file__), "--output_dir", args.output_dir, "--suite",
                                args.suite, "--spec", args.spec, "--modes", m, "--only", t.name, "--in_process",
                                "--top_k", str(args.top_k), "--stage1_seeds", str(args.stage1_seeds)], check=True)
                done = json.load(open(path))
            elif m not in done:
                print(f"{t.name}: {m} ...", flush=True)
                done[m] = {**tune_task(t, args.spec, rules[m]), "rule": described[m]}
                print(f"{t.name}: {m}: {done[m]['choice']} in {done[m]['wall_s']:.0f} s wall, "
                      f"{done[m]['cpu_s']:.0f} s CPU", flush=True)
                with open(path + ".tmp", "w") as f:
                    json.dump(done, f, indent=1)
                os.replace(path + ".tmp", path)
        results[t.name] = {m: done[m] for m in modes}
    md = table(results, args.spec, args.suite)
    with open(os.path.join(args.output_dir, "comparison.json"), "w") as f:
        json.dump({"spec": args.spec, "suite": args.suite, "rules": described, "results": results,
                   "agreement": {n: compare(r) for n, r in results.items()} if len(modes) == 2 else None}, f, indent=1)
    with open(os.path.join(args.output_dir, "comparison.md"), "w") as f:
        f.write(md)
    print(md)
    return results


if __name__ == "__main__":
    main()

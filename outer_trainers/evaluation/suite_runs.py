"""Evaluating optimizers on a suite (or a list of tasks) against baselines tuned per task.

    out = evaluate("eval/", optimizers=["run/theta_final.msgpack"], suite="heldout-cpu", baselines=["adam"])
    out = evaluate("eval/", optimizers=["pretrained:NAME"], tasks=[...], tuning=BaselineTuning(max_extensions=0))

For every task (`task_plan.check_arguments`) and seed, every optimizer and every baseline trains
the same task draw from the same initialisation (`task_trainer.task_draws`), and each run measures,
in the same program, its validation loss at 20 evenly spaced steps (the last at the end) and its
test loss (and, for an image classifier, test accuracy) after training. Each baseline spec
("adam", "adamw:tuned", ...) is tuned over rate x weight decay x schedule on the final validation
loss by the two-stage rule (`baselines`), each learned optimizer runs once, told the task's step budget
(`optimizer_specs.run_learned`), and every optimizer's wall time per training step is measured
(`wall_clock.step_seconds`). Each optimizer is then scored against each tuned baseline's best run
(`scores.compare_runs` with the task's trivial loss, `aggregate.summarize`: wins and IQMs of the
test-loss ratio first, then of the train-loss ratio, speedups and the held-out VeLOdrome ratios,
with stratified-bootstrap intervals), every optimizer and baseline gets its performance profile on
test loss (`aggregate.performance_profile`) and its time to reach tuned AdamW's final validation
loss in wall-clock (`wall_clock.time_to_target`, `target_baseline`). `output_dir` receives
RESULT_FILES:

    results.json  everything, machine-readable (non-finite numbers as null, with flags)
    results.md    the test-loss summary, the train-loss summary, the per-task tables, time to target
    results.csv   task, optimizer, learning_rate, seed, final_train_loss, valid_loss, test_loss,
                  test_accuracy for every run
    curves.png    per task: train-loss curves (median over seeds, min-max band) of each optimizer
                  and each baseline at its best rate                                  (with `plots`)
    curves.npz    every curve, [seeds, steps] per (task, optimizer, lr), and the validation curves
    performance_profile.png  each optimizer's performance profile on test loss        (with `plots`)

and an earlier evaluation's files are never replaced unless `overwrite`. Each task's runs are also
kept in `finished_tasks/` as soon as the task is done (`task_store`): the same evaluation run again
into the same directory after a stop trains only the tasks it had not finished. How the baselines are
tuned is one `BaselineTuning` value; `scripts/evaluate.py` builds it from its gin bindings (`BaselineTuning.momentum = 0.8`).
"""
from __future__ import annotations

import functools
import os
import resource
import time
from typing import Any, Callable, Optional, Sequence

import jax
import numpy as np

from outer_trainers.evaluation.ablations import rule_chains
from outer_trainers.evaluation.aggregate import performance_profile, summarize
from outer_trainers.evaluation.curves import plot_curves, plot_performance_profile, save_curves
from outer_trainers.evaluation.baselines import BaselineTuning, baseline_setup, schedule_index, tune_spec
from outer_trainers.evaluation.optimizer_specs import (is_tuned_baseline, is_untuned_baseline, learned_tx,
                                                        optimizer_labels, parse_baseline, resolve_optimizer,
                                                        run_learned)
from outer_trainers.evaluation.report import results_json, results_markdown, write_csv, write_json, write_text
from outer_trainers.evaluation.scores import COLLAPSE_MARGIN, compare_runs, trivial_loss_of
from outer_trainers.evaluation.task_plan import check_arguments
from outer_trainers.evaluation.task_store import FINISHED_DIR, TaskStore, spec_identity
from outer_trainers.evaluation.task_trainer import VALID_POINTS, VALID_SPLIT, task_draws
from outer_trainers.evaluation.tuning import ADAMW_WEIGHT_DECAY, baseline, best_runs, tune_learning_rate
from outer_trainers.evaluation.wall_clock import step_seconds, time_to_target
from tasks.base import TaskFamily, check_count
from tasks.conv import ConvFamily
from tasks.conv_bn import ConvBNFamily

RESULT_FILES = ("results.csv", "curves.png", "results.md", "curves.npz", "results.json", "performance_profile.png")
# scheduled, tuned AdamW, Muon and SGD with momentum (rate, decay and schedule chosen on validation loss), and
# constant-rate Adam as the reference row of the earlier protocol
DEFAULT_BASELINES = ("adam", "adamw:tuned", "muon:tuned", "sgdm:tuned")
Log = Optional[Callable[[str], None]]
print_now = functools.partial(print, flush=True)


def runs_in_sequence(family: TaskFamily) -> bool:
    """Whether a task's rates and seeds run one after another inside each program (convnets: on
    CPU a vmap over their weights becomes a slower grouped convolution) rather than vmapped.

    Args:
      family: the task family.

    Returns:
      True for a `tasks.ConvFamily` or `tasks.ConvBNFamily`.
    """
    return isinstance(family, (ConvFamily, ConvBNFamily))


def trivial_losses(family: TaskFamily, seeds: Sequence[int]) -> Optional[list]:
    """Each seed's task's trivial loss (`scores.trivial_loss_of`), or None when no task declares one.

    Args:
      family: the task family.
      seeds: the seeds, drawn as `task_draws` draws them.

    Returns:
      [S] floats or Nones, or None when every seed's is unknown.
    """
    cfgs, _ = task_draws(family, seeds)
    out = [trivial_loss_of(family.task_fn(jax.tree_util.tree_map(lambda x, i=i: x[i], cfgs)))
           for i in range(len(seeds))]
    return out if any(v is not None for v in out) else None


def run_task(family: TaskFamily, num_steps: int, seeds: Sequence[int], optimizers: Sequence[dict],
             baselines: Sequence[str], grids: dict, eval_split: str, *, momentum: float = 0.9,
             weight_decay: float = ADAMW_WEIGHT_DECAY, max_extensions: int = 4, valid_split: str = VALID_SPLIT,
             valid_points: int = VALID_POINTS, select_by: str = "valid",
             time_steps: bool = False, tuned_runs: Optional[dict] = None,
             tuning: Optional[BaselineTuning] = None) -> tuple[list[dict], dict]:
    """Trains one task per seed with every optimizer and every baseline (tuned: `tune_spec` or `tune_learning_rate`).

    Every setting sees the same task draws and initialisations (`task_draws`). A baseline given
    as an optimizer under its own name is tuned once, not twice. With `tuning`, every baseline spec
    (`baselines.parse_baseline`) is tuned by `baselines.tune_spec` (rate x decay x
    schedule, the two-stage rule) and `grids`, `momentum`, `weight_decay`, `max_extensions` are
    ignored; without it (the earlier rule, kept for meta-training's validation selection) every
    baseline is a bare name tuned over its rate grid at a constant rate (`tune_learning_rate`). With
    `time_steps`, every run of an optimizer gets "step_seconds": its measured wall time per training
    step (`wall_clock.step_seconds`, a baseline at its best setting).

    Args:
      family: the task family (a Task lifted by `single_task_family` draws the same task every seed).
      num_steps: training steps per run (also each learned optimizer's horizon).
      seeds: one task draw and run key per seed.
      optimizers: `resolve_optimizer` results.
      baselines: baseline names, each tuned; "published:NAME" ones run once, untuned.
      grids: {baseline name: its starting learning-rate grid}.
      eval_split: the data split of the test loss after training.
      momentum: SGD's momentum.
      weight_decay: AdamW's weight decay.
      max_extensions: the most grid extensions per baseline.
      valid_split: the validation split (tuning reads its final loss).
      valid_points: validation measurements per run (`task_trainer.valid_schedule`).
      select_by: the tuning rule's loss, "valid" (the protocol's) or "train" (`tuning.best_runs`).
      time_steps: measure each optimizer's wall time per step.
      tuned_runs: {baseline name: its runs on this task from an earlier evaluation with the same
        settings} (`task_store.TaskStore.baseline_runs`): used as they are, not tuned again.
      tuning: how baseline specs are tuned (`BaselineTuning`), or None: the earlier constant-rate rule.

    Returns:
      (runs, seconds): the run dicts (`task_trainer`'s module docstring, float64; "learning_rate"
      NaN for a learned optimizer), optimizers first, and {name: wall seconds}.
    """
    cfgs, run_keys = task_draws(family, seeds)
    common = dict(eval_split=eval_split, sequential=runs_in_sequence(family), valid_split=valid_split,
                  valid_points=valid_points)
    runs, seconds, tuned = [], {}, set()

    def tune(label, name):
        if tuning is not None:
            own = tune_spec(family, name, tuning, num_steps, cfgs, run_keys, label=label, select_by=select_by,
                            **common)
            if time_steps:
                best = best_runs(own, select_by)[label]
                make_tx, _, _ = baseline_setup(name, tuning, num_steps)
                f32 = lambda x, dt=jax.numpy.float32: jax.numpy.asarray(x, dt)
                timed(own, make_tx, {"learning_rate": f32(best["learning_rate"]),
                                     "weight_decay": f32(best["weight_decay"]),
                                     "schedule": f32(schedule_index(best["schedule"]), jax.numpy.int32)})
            return own
        if name not in grids:
            raise ValueError(f"run_task: baseline {name!r} needs tuning=BaselineTuning(...) (a schedule or a "
                             f"decay grid); without it the baselines are {sorted(grids)}")
        make_tx = baseline(name, momentum=momentum, weight_decay=weight_decay)
        own = tune_learning_rate(family, label, make_tx, grids[name], cfgs, run_keys, num_steps,
                                 max_extensions=max_extensions, select_by=select_by, **common)
        if time_steps:
            lr = best_runs(own, select_by)[label]["learning_rate"]
            timed(own, make_tx, jax.numpy.asarray(lr, jax.numpy.float32))
        return own

    def timed(own, make_tx, tx_args):
        per_step = step_seconds(family, make_tx, tx_args, cfgs, run_keys)
        for r in own:
            r["step_seconds"] = per_step

    def learned(opt):
        run = run_learned(opt, family, num_steps, cfgs, run_keys, **common)
        if time_steps:
            timed([run], *learned_tx(opt, num_steps))
        return run

    for opt in optimizers:
        start = time.perf_counter()
        if opt["kind"] == "baseline":
            runs += tune(opt["label"], opt["spec"])
            if opt["label"] == opt["spec"]:
                tuned.add(opt["spec"])  # a baseline evaluated as an optimizer is not tuned twice
        else:
            runs.append(learned(opt))
        seconds[opt["label"]] = time.perf_counter() - start
    for name in baselines:
        if name in tuned:
            continue
        start = time.perf_counter()
        if tuned_runs and name in tuned_runs:
            runs += tuned_runs[name]
        elif is_untuned_baseline(name):  # published:NAME: run once, as its authors released it
            runs.append(learned(resolve_optimizer(name, name)))
        else:
            runs += tune(name, name)
        seconds[name] = time.perf_counter() - start
    return runs, seconds


def target_baseline(baselines: Sequence[str]) -> str:
    """The tuned AdamW whose final validation loss is the time-to-target's target: "adamw:tuned" when it is
    a baseline, else the first AdamW spec among `baselines`, else "adamw".

    Args:
      baselines: the evaluation's baseline specs.

    Returns:
      the spec.
    """
    adamws = [b for b in baselines if is_tuned_baseline(b) and b.partition(":")[0] == "adamw"]
    return "adamw:tuned" if "adamw:tuned" in adamws else (adamws[0] if adamws else "adamw")


def target_times(runs: Sequence[dict], target_name: str = "adamw") -> dict:
    """Each optimizer's time to reach `target_name`'s final validation loss (`wall_clock.time_to_target`).

    Args:
      runs: one task's runs (`run_task`, with "step_seconds").
      target_name: the tuned baseline whose median final validation loss is the target.

    Returns:
      `{"target": the loss or None (no such baseline, or every rate of it diverged), "optimizers":
      {name: {"steps", "step_seconds", "seconds"}}}`.
    """
    best = best_runs(runs)
    ref = best.get(target_name)
    target = None if ref is None or ref.get("diverged") else float(np.median(ref["valids"]))
    seconds = {name: r["step_seconds"] for name, r in best.items() if "step_seconds" in r}
    return {"target": target, "optimizers": time_to_target(best, target, seconds)}


def _cpu_seconds() -> float:
    """User + system CPU time of this process so far (all threads), in seconds."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def evaluate(output_dir: str, *, optimizers: Sequence[str] = (), theta_path: Optional[str] = None,
             suite: Optional[str] = None, tasks: Sequence[Any] = (), num_steps: int = 1000, num_seeds: int = 3,
             baselines: Sequence[str] = DEFAULT_BASELINES, tuning: BaselineTuning = BaselineTuning(),
             eval_split: str = "test", valid_split: str = VALID_SPLIT, valid_points: int = VALID_POINTS,
             time_steps: bool = True, collapse_margin: float = COLLAPSE_MARGIN, n_resamples: int = 2000,
             plots: bool = True, overwrite: bool = False, baselines_from: Optional[str] = None,
             log: Log = print_now) -> dict:
    """Runs the evaluation of the module docstring and writes its files to `output_dir`.

    Per optimizer L and tuned baseline B (its rate chosen on validation loss), over the tasks: wins
    (e_L < e_B on test loss: the headline; f_L < f_B on train loss, speedup > 1) and interquartile
    means, with 95% stratified-bootstrap intervals, of e_L / e_B, f_L / f_B, the speedups and the
    held-out VeLOdrome ratios (`scores`, `aggregate`); the tasks on which L diverged or collapsed;
    every optimizer's performance profile on test loss; and the time to reach tuned AdamW's final
    validation loss in wall-clock.

    Args:
      output_dir: where the result files go (created if missing).
      optimizers: the optimizers evaluated: theta file paths, "pretrained:NAME" or baseline specs.
      theta_path: one more theta file (the older spelling of an optimizer).
      suite: a `tasks.suites` name; its tasks bring their own steps, seeds and eval split.
      tasks: Tasks or TaskFamilies instead of a suite; a repeated name gets its index appended.
      num_steps: training steps per run of `tasks`.
      num_seeds: task draws (and run keys) per task of `tasks`, seeds 0 .. num_seeds - 1.
      baselines: the baselines each optimizer is compared with: tuned baseline specs ("adam",
        "adamw:cosine", "muon:tuned": `optimizer_specs.parse_baseline`) or untuned published learned
        optimizers ("published:NAME", `optimizer_specs.untuned_baseline_names()`).
      tuning: how the baselines are tuned (`BaselineTuning`: grids, decays, schedules, the two-stage rule).
      eval_split: the data split of the test loss of `tasks` (a suite task has its own).
      valid_split: the validation split every task is tuned on (never the eval split).
      valid_points: validation measurements per run, evenly spaced, the last at the end
        (`task_trainer.valid_schedule`): the resolution of the held-out VeLOdrome and of the time
        to target.
      time_steps: measure each optimizer's wall time per step for the time to target (a compile
        and a few short runs per optimizer and task; False: no seconds, steps only).
      collapse_margin: a run is collapsed when its final train loss is >= (1 - margin) x its task's
        trivial loss (`scores.collapsed`).
      n_resamples: bootstrap resamples of each interval.
      plots: write curves.png and performance_profile.png.
      overwrite: replace the result files of an earlier evaluation in `output_dir` (otherwise refused),
        and train again the tasks whose kept record (`finished_tasks/`) was made with other settings
        (otherwise refused). A task kept with the same settings is read, never trained again, with or
        without `overwrite`; delete `finished_tasks/` to train every task afresh.
      baselines_from: the output directory of an earlier evaluation whose tuned baselines are reused,
        task by task, where it was made with the same settings but for the optimizers under test
        (`task_store`); the others are tuned here, and the log says which and why.
      log: receives each task's progress line and, at the end, results.md's text (None: silent).

    Returns:
      `{"results": {task: runs}, "comparisons": ..., "summary": ..., "profile": ..., "json": results.json's content}`.

    Raises:
      ValueError (TypeError for a task of another type), before any training or file is written,
      naming the argument: see `check_arguments`.
    """
    log = log or (lambda text: None)
    if not isinstance(tuning, BaselineTuning):
        raise TypeError(f"evaluate: tuning must be a BaselineTuning, got {type(tuning).__name__}")
    specs = list(optimizers) + ([theta_path] if theta_path else [])
    grids = tuning.grids()
    momentum, weight_decay, max_extensions = tuning.momentum, tuning.weight_decay, tuning.max_extensions
    plan = check_arguments(output_dir, specs, suite, tasks, num_steps, num_seeds, baselines, grids, momentum,
                           eval_split, max_extensions, valid_split=valid_split)
    tuning.check()
    target = target_baseline(baselines)
    valid_points = check_count(valid_points, "evaluate: valid_points")
    if not 0.0 <= collapse_margin < 1.0:
        raise ValueError(f"evaluate: collapse_margin must be in [0, 1), got {collapse_margin!r}")
    existing = [f for f in RESULT_FILES if os.path.exists(os.path.join(output_dir, f))]
    if existing and not overwrite:
        raise ValueError(f"evaluate: {output_dir} already holds the results of an evaluation ({', '.join(existing)}); "
                         f"choose another --output_dir or pass --overwrite to replace them")
    opts = [resolve_optimizer(s, label) for s, label in zip(specs, optimizer_labels(specs))]
    chains = rule_chains(list(specs) + list(baselines))  # ablation and rules specs: their chains, read now
    store = TaskStore(output_dir, {"optimizers": [[o["label"], spec_identity(o["spec"])] for o in opts],
                                   "baselines": list(baselines), "grids": {b: list(map(float, g)) for b, g in grids.items()},
                                   "momentum": momentum, "weight_decay": weight_decay, "max_extensions": max_extensions,
                                   "tuning": tuning.describe(), "stage1_seeds": tuning.stage1_seeds,
                                   "valid_split": valid_split, "valid_points": valid_points, "time_steps": time_steps,
                                   **({"rule_chains": chains} if chains else {})},
                      overwrite=overwrite)
    earlier = None if baselines_from is None else TaskStore(baselines_from, store.settings)
    if baselines_from is not None and not os.path.isdir(os.path.join(baselines_from, FINISHED_DIR)):
        raise ValueError(f"evaluate: baselines_from {baselines_from!r} holds no finished_tasks/ of an evaluation "
                         f"(--baselines_from)")
    results, info, trivial, start, cpu_start = {}, {}, {}, time.perf_counter(), _cpu_seconds()
    for name, family, steps, seeds, split in plan:
        task_settings = {"name": name, "task": repr(family), "num_steps": steps, "seeds": list(seeds), "eval_split": split}
        kept = store.load(name, task_settings)
        if kept is None:
            reused = None
            if earlier is not None:
                reused, why = earlier.baseline_runs(name, task_settings, [b for b in baselines if is_tuned_baseline(b)])
                got = f"{', '.join(reused)} from {baselines_from}" if reused else f"nothing from {baselines_from}"
                log(f"{name}: tuned baselines: {got}" + (f"; the others tuned here ({why})" if why else ""))
            runs, seconds = run_task(family, steps, seeds, opts, baselines, grids, split, momentum=momentum,
                                     weight_decay=weight_decay, max_extensions=max_extensions, valid_split=valid_split,
                                     valid_points=valid_points, time_steps=time_steps, tuned_runs=reused,
                                     tuning=tuning)
            store.save(name, task_settings, {"runs": runs, "seconds": seconds})
        else:
            runs, seconds = kept["runs"], kept["seconds"]
        results[name], trivial[name] = runs, trivial_losses(family, seeds)
        info[name] = {"num_steps": steps, "seeds": list(seeds), "eval_split": split, "valid_split": valid_split,
                      "seconds": seconds, "trivial_loss": trivial[name], "time_to_target": target_times(runs, target)}
        took = f"{steps} steps x {len(seeds)} seeds in {sum(seconds.values()):.0f} s"
        log(f"{name}: {took}" if kept is None else f"{name}: kept from an earlier run into {output_dir} ({took})")
    comparisons, summary = {}, {}
    for opt in opts:
        for base in baselines:
            if opt["label"] == base:
                continue
            pair = f"{opt['label']} vs {base}"
            pairs = {t: (best_runs(runs)[opt["label"]], best_runs(runs)[base]) for t, runs in results.items()}
            comparisons[pair] = {t: compare_runs(*p, trivial[t], collapse_margin) for t, p in pairs.items()}
            summary[pair] = summarize(comparisons[pair], pairs, n_resamples=n_resamples)
    profile = performance_profile(results)
    train_profile = performance_profile(results, by="train")
    total, cpu = time.perf_counter() - start, _cpu_seconds() - cpu_start
    meta = {"suite": suite, "optimizers": {o["label"]: o["spec"] for o in opts}, "baselines": list(baselines),
            "protocol": {"grid": {b: list(grids[parse_baseline(b)[0]]) for b in baselines if is_tuned_baseline(b)},
                         **tuning.describe(), "extend_by": 2,
                         "max_extensions": max_extensions, "tuning": f"lowest median over seeds of the final "
                         f"validation loss ({valid_split} split); a diverged seed loses", "valid_split": valid_split,
                         "valid_points": valid_points, "headline": "test loss at the end of training (each task's "
                         "eval split); train loss secondary", "final_train": "mean train loss of the last 10% "
                         "of steps", "statistic": "median over seeds", "speedup": "see outer_trainers.evaluation.protocol",
                         "intervals": f"95% stratified-bootstrap percentile intervals of the IQM across tasks, seeds "
                         f"resampled within each task, {n_resamples} resamples (scipy.stats.bootstrap)",
                         "velodrome": "steps the tuned baseline's validation curve needs to reach the optimizer's "
                         "final validation loss, over the budget (null with velodrome_steps null: not within the "
                         "budget)", "time_to_target": "steps and wall-clock seconds (measured seconds per "
                         "training step x steps) for each optimizer's validation curve to reach tuned AdamW's "
                         "final validation loss (see outer_trainers.evaluation.scores)",
                         "collapse": f"final train loss >= (1 - {collapse_margin}) x the task's trivial_loss "
                         f"(else: not below the initial loss)", "weight_decay": weight_decay, "momentum": momentum,
                         "time_to_target_baseline": target},
            "performance_profile": {"on": "test loss", "tasks": profile["tasks"], "ratios": profile["ratios"]},
            "performance_profile_train": {"tasks": train_profile["tasks"], "ratios": train_profile["ratios"]},
            "seconds": total, "cpu_seconds": cpu}
    doc = results_json(results, info, comparisons, summary, meta)
    os.makedirs(output_dir, exist_ok=True)
    write_csv(os.path.join(output_dir, "results.csv"), results, info)
    if plots:
        plot_curves(os.path.join(output_dir, "curves.png"), results)
        plot_performance_profile(os.path.join(output_dir, "performance_profile.png"), profile)
    save_curves(os.path.join(output_dir, "curves.npz"), results)
    write_json(os.path.join(output_dir, "results.json"), doc)
    what = f"suite {suite}" if suite else f"{len(results)} tasks"
    named = [f"{b} (untuned)" if is_untuned_baseline(b) else b for b in baselines]
    title = f"{', '.join(o['label'] for o in opts)} vs tuned {', '.join(named)} on {what}"
    text = results_markdown(title, comparisons, summary, results, {t: i["num_steps"] for t, i in info.items()},
                            total, cpu, profile, plots, {t: i["time_to_target"] for t, i in info.items()},
                            stage1_seeds=tuning.stage1_seeds, top_k=tuning.top_k)
    write_text(os.path.join(output_dir, "results.md"), text)
    log(text)
    return {"results": results, "comparisons": comparisons, "summary": summary, "profile": profile, "json": doc}

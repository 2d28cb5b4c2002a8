#!/usr/bin/env python
"""Evaluate optimizers against baselines tuned per task, on an evaluation suite or a list of tasks.

    python scripts/evaluate.py --suite heldout-cpu --optimizer run/theta_final.msgpack --output_dir eval/
    python scripts/evaluate.py --suite heldout-cpu --optimizer pretrained:NAME --baselines adam --output_dir eval/
    python scripts/evaluate.py --optimizer run/theta_final.msgpack --task "QuadraticFamily(dim=10)" \
        --task "ImageMLPFamily(hidden_sizes=(32,))" --num_steps 500 --num_seeds 3 --output_dir eval/

`--optimizer` (repeatable; `--theta PATH` is the same as `--optimizer PATH`) is a theta file
(`lopt.save_theta`), `pretrained:NAME` (`lopt.pretrained.load(NAME, num_steps=...)`), an ablation of
a shipped optimizer, or a baseline spec (then it is tuned like a baseline, below). A learned
optimizer is told each task's step budget and is not tuned. The ablations (docs/evaluation.md,
outer_trainers.evaluation.ablations; the rule chain is the record's, lopt.pretrained.info(NAME)["rules"]):

    pretrained:NAME-PART     NAME with the part PART of its rule chain switched off (pretrained:celo2_v9-growth_limited)
    pretrained:NAME-rules    NAME's theta alone, no rule around it
    untrained:NAME[#SEED]    NAME's architecture and rules with an untrained theta (init at jax.random.key(SEED), 0)
    rules:NAME@BASELINE      NAME's rules around a baseline spec (rules:celo2_v9@adamw), tuned like that baseline

A suite (`tasks.suites`, e.g. heldout-cpu, smoke) fixes
the tasks, their step budgets, seeds and eval split; `--task` (a gin-style constructor call of a
public tasks class; a family draws one task per seed) takes `--num_steps` and `--num_seeds`.

The protocol is outer_trainers.evaluation.protocol's: held-out first. Every run trains on a task's
train split and measures, in the same jitted program, its validation loss ("inner_valid", at 20
evenly spaced steps, the last at the end) and its test loss on the eval split ("test"; and test
accuracy for image classifiers) after training. A baseline spec (`--baselines`, comma-separated) is
NAME or NAME:SCHEDULE, NAME one of adam, adamw, muon (optax.contrib.muon: weight matrices and conv
kernels orthogonalised, embeddings and vectors by Adam) and sgdm (SGD with momentum 0.9), SCHEDULE one of

    constant   the rate constant over the task's step budget (a bare NAME means this, as it always did)
    cosine     linear warm-up over 5% of the budget, then cosine decay to 0 at the budget's end
    linear     linear warm-up, then linear decay to 0
    tuned      the schedule chosen with the rate: constant or warm-up + cosine

(optax's schedules over the same step budget a learned optimizer is told). The default baselines are
adamw:tuned, muon:tuned, sgdm:tuned and constant-rate adam, the reference row of the earlier protocol.
Every baseline is tuned per task over rate x weight decay x schedule on the final VALIDATION loss, by
one two-stage rule: one seed trains at every point of the grid (7 log-spaced rates: Adam, AdamW
1e-4..1e-1; Muon, SGD 1e-3..1; AdamW's and Muon's weight decay 0, 1e-3, 1e-2, 0.1, 1, multiplied by the
rate as optax does; Adam and SGD no decay), all points in one jitted program, the grid extended along
an axis while its best point lies on that axis's edge; then every seed trains at the 3 best points, and
the one of lowest median final validation loss over seeds wins (a diverged seed loses). `BaselineTuning.*`
gin bindings change it: `BaselineTuning.top_k = None` (every seed at every point),
`BaselineTuning.weight_decay = 0.01` (AdamW's decay fixed, the earlier protocol),
`BaselineTuning.warmup_fraction`, `BaselineTuning.tuned_schedules`. Test data never enters
tuning. Each optimizer is then scored against each tuned baseline. The headline is the TEST loss at
the end of training: wins, the interquartile mean (IQM) of the test-loss ratio with its 95%
stratified-bootstrap interval, the held-out VeLOdrome ratio (the steps the baseline's validation
curve needs to reach the optimizer's final validation loss, over the budget; "> budget" when it
does not) and the performance profile on test loss. Train loss is the secondary table: final
train loss (mean of the last 10% of steps), its ratio, time to reach the baseline's final train
loss and the speedup. With adamw among the baselines, every optimizer's time to reach tuned
AdamW's (adamw:tuned's) final validation loss is reported in steps and wall-clock seconds (its
measured time per training step x the step; evaluate.time_steps = False skips the measurement). The summary also
names the tasks on which an optimizer diverged or collapsed (ended no better than the task's
trivial loss, where the task declares one). Writes to output_dir (refusing to replace an earlier
evaluation's files unless --overwrite):

    results.json  everything below, machine-readable (non-finite numbers as null, with flags)
    results.md    the test-loss summary, the train-loss summary, the per-task tables, the
                  performance profile in numbers and the time to target
    results.csv   task, optimizer, learning_rate, seed, final_train_loss, valid_loss, test_loss,
                  test_accuracy for every run
    curves.png    per task: train-loss curves (median over seeds, min-max band) of each optimizer
                  and each baseline at its best rate                       (not with --no_plots)
    curves.npz    every curve, [seeds, steps] per (task, optimizer, lr), and the validation curves
    performance_profile.png  per optimizer, the fraction of tasks whose test loss is within a
                  factor tau of the best optimizer's, over tau            (not with --no_plots)
    finished_tasks/  each task's runs, written as soon as the task is done: the same command run
                  again after a stop (a lost machine, Ctrl-C) trains only the unfinished tasks

`--baselines_from EARLIER_DIR` compares new optimizers with the baselines an earlier evaluation tuned
(read from its finished_tasks/, task by task, where every setting but the optimizers matches), so
evaluating another theta costs only its own runs:

    python scripts/evaluate.py --suite heldout-cpu --optimizer run2/theta_best.msgpack --baselines adamw,muon \
        --baselines_from eval/run1 --output_dir eval/run2

Every argument is checked, and every suite task's data loaded, before any training or file is
written (`check_arguments`).

The stability check replaces the comparison with `--stress_steps N`: each learned optimizer
(no baselines) trains every task of the suite (or of `--task`) for N steps, told the horizon N, and
a seed fails when a loss goes non-finite, the final train loss is not below the initial one, or it
collapsed to the task's trivial loss (`stress`; stress.json and stress.md; exit status 1 on a failure):

    python scripts/evaluate.py --suite heldout-cpu --optimizer pretrained:NAME --stress_steps 8000 --output_dir st/
"""
from __future__ import annotations

import argparse
import ast
from typing import Optional, Sequence

import gin

from outer_trainers import evaluation
from outer_trainers.gin_registry import load_config  # importing gin_registry registers the public API with gin
from tasks import suites

# gin lives here, at the edge: `evaluate.*` and `stress.*` bindings configure the library's functions, and
# `BaselineTuning.*` how `evaluate` tunes the baselines.
evaluate = gin.external_configurable(evaluation.evaluate, name="evaluate")
stress = gin.external_configurable(evaluation.stress_test, name="stress")
baseline_tuning = gin.external_configurable(evaluation.BaselineTuning, name="BaselineTuning")


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
                   help="a theta file, an outer_train checkpoint file, pretrained:NAME, an ablation "
                        "(pretrained:NAME-PART, pretrained:NAME-rules, untrained:NAME[#SEED], rules:NAME@BASELINE), "
                        "or a baseline spec "
                        f"NAME[:SCHEDULE] (NAME of {', '.join(evaluation.baseline_names())}; SCHEDULE of "
                        f"{', '.join(evaluation.SCHEDULE_CHOICES)}; e.g. adamw:cosine); repeatable")
    p.add_argument("--theta", help="a theta_final.msgpack (the same as --optimizer PATH)")
    p.add_argument("--baselines", help=f"comma-separated baselines: tuned ones, NAME[:SCHEDULE] with NAME of "
                                       f"{', '.join(evaluation.baseline_names())} and SCHEDULE of "
                                       f"{', '.join(evaluation.SCHEDULE_CHOICES)} (bare NAME: constant; e.g. "
                                       f"adamw:cosine) or a shipped optimizer's rules on one, rules:NAME@BASELINE "
                                       f"(e.g. rules:celo2_v9@adamw), and untuned learned ones: published:NAME (e.g. "
                                       f"published:celo_adam) and ablations (pretrained:NAME-PART, untrained:NAME) "
                                       f"(default {','.join(evaluation.DEFAULT_BASELINES)}; '' for none)")
    p.add_argument("--task", action="append", default=[], help="e.g. 'QuadraticFamily(dim=4)' (repeatable)")
    p.add_argument("--num_steps", type=int, help="steps per run of --task tasks (sets evaluate.num_steps)")
    p.add_argument("--num_seeds", type=int, help="task draws per --task task (sets evaluate.num_seeds)")
    p.add_argument("--gin_file", action="append", default=[], help="gin config file (repeatable)")
    p.add_argument("--gin_param", action="append", default=[],
                   help="gin binding, e.g. 'evaluate.num_steps = 100', 'BaselineTuning.max_extensions = 0', "
                        "'evaluate.valid_split = \"outer_valid\"' or 'evaluate.time_steps = False'")
    p.add_argument("--stress_steps", type=int,
                   help="instead of the comparison, the stability check: each learned optimizer trains every task "
                        "this many steps (told this horizon); fails when a loss goes non-finite, ends above its start "
                        "or collapses to the task's trivial_loss")
    p.add_argument("--no_plots", action="store_true", help="write no curves.png or performance_profile.png")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier evaluation's files in --output_dir")
    p.add_argument("--baselines_from", help="an earlier evaluation's --output_dir: reuse its tuned baselines on every "
                                            "task it ran with the same settings (only the optimizers may differ)")
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
    if args.no_plots:
        params.append("evaluate.plots = False")
    if args.baselines_from:
        params.append(f"evaluate.baselines_from = {args.baselines_from!r}")
    for flag in ("num_steps", "num_seeds"):
        if getattr(args, flag) is not None:
            params.append(f"evaluate.{flag} = {getattr(args, flag)}")
    if args.stress_steps is not None:
        if args.baselines is not None or args.num_steps is not None or args.no_plots or args.baselines_from:
            raise SystemExit("error: --stress_steps replaces the comparison: it takes no --baselines, --num_steps, "
                             "--no_plots or --baselines_from")
        params = [p.replace("evaluate.", "stress.", 1) if p.startswith("evaluate.") else p for p in params]
        params.append(f"stress.stress_steps = {args.stress_steps}")
        load_config(args.gin_file, params)
        return stress(args.output_dir)
    load_config(args.gin_file, params)
    return evaluate(args.output_dir, tuning=baseline_tuning())


if __name__ == "__main__":
    if main().get("all_ok") is False:
        raise SystemExit(1)

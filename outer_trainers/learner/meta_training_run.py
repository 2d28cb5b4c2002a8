"""One meta-training run in an output directory, step by step (what scripts/outer_train.py runs).

    check_run_arguments(num_workers=..., workers=...)
    learner, estimators = build_run(task_family=..., ..., copies=worker_copies(num_workers, n))
    selector = make_validation_selector(learned_opt, output_dir, Validation(every=..., suite=...))
    run, starts_new = check_output_dir(output_dir, policy, run_metadata(learner, estimators, config),
                                       resume=resume, overwrite=overwrite, extend=extend,
                                       num_steps=num_steps)                      # reads, writes nothing
    with workers.connection():                          # only with Ray workers: fails fast, writes nothing
        prepare_output_dir(run, starts_new=starts_new, overwrite=overwrite, config_text=text)
        state = meta_train_locally(learner, estimators, num_steps, validation=selector, ...)
        # or, on Ray: workers.meta_train(make_run, num_steps, ...)  (outer_trainers.distributed.RayWorkers)
        compare_with_adam(task_family, learned_opt, state.final_theta, output_dir, Comparison(...), seed=seed)

The output-directory policy: a directory holds one run. `check_output_dir` decides, without
writing, whether the run resumes from the newest readable checkpoint or starts new, and refuses
(`ExistingRunError`) a new run over another run's results (`SCRIPT_RESULTS`) unless `overwrite`;
a resume whose learner, estimators or config differ from the checkpoint's is refused too. A
resume may change the length (`num_steps`, recorded in the checkpoints): the run is trained
further and the extension recorded; with `extend` a length below the steps taken is refused and
the horizon bindings may change too (`runs.run_extension`). Only then does `prepare_output_dir`
write: it deletes the earlier results when overwriting and writes the run's config (config.gin).
So every refusal leaves the directory as it was.

Each step is a plain function of objects (no gin); `learner.gin_run.train` composes them as the
gin-configurable `train` of scripts/outer_train.py. The settings groups are the dataclasses of
`learner.run_settings`. Meta-training on Ray workers is not here: the run is handed what runs the
workers (`distributed.RayWorkers`), so nothing in learner/ imports distributed/. This module uses
the package's public API through `outer_trainers` (like a user's script) and is not re-exported by
`outer_trainers`.
"""
from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Callable, Optional, Sequence

import jax
import optax

import outer_trainers as ot
from lopt import pretrained
from lopt.base import LearnedOptimizer
from lopt.file_io import atomic_write_bytes
from outer_trainers.learner.run_settings import Comparison, Validation
from outer_trainers.learner.validation_selection import VALIDATION_CACHE
from outer_trainers.runs.run_checkpoints import RUN_RESULTS, RunCheckpoints
from outer_trainers.steps.truncation_schedule import TruncationSchedule
from tasks.base import TaskFamily

CONFIG_FILE, COMPARISON_FILE = "config.gin", "comparison.md"
SCRIPT_RESULTS = RUN_RESULTS + (CONFIG_FILE, COMPARISON_FILE)  # what a run leaves in its output directory
COMPARISON_SEED_OFFSET = 10_000  # the comparison's key is the run's seed + this


def check_run_arguments(*, num_workers: int, workers: Any = None) -> None:
    """Refuses settings of a run that could only fail after meta-training, before anything is built.

    (Each settings group checks its own fields when it is built; these are the checks across them.)

    Args:
      num_workers: Ray worker actors (0: meta-train in this process).
      workers: what runs the workers (e.g. `outer_trainers.distributed.RayWorkers()`); needed with workers.

    Raises:
      ValueError: a negative `num_workers`, or workers without `workers`; the message names the binding to
        change.
    """
    if num_workers < 0:
        raise ValueError(f"train.num_workers must be >= 0 (0: no Ray workers), got {num_workers}")
    if num_workers > 0 and workers is None:
        raise ValueError(f"train.num_workers = {num_workers} meta-trains on Ray workers, but nothing runs them: pass "
                         f"workers=outer_trainers.distributed.RayWorkers() (scripts/outer_train.py does), or bind "
                         f"train.workers = @RayWorkers()")


def worker_copies(num_workers: int, num_estimators: int) -> int:
    """How many times the estimator list is repeated so that each Ray worker owns at least one estimator.

    Args:
      num_workers: Ray worker actors (0: none).
      num_estimators: estimators in the run's list.

    Returns:
      ceil(num_workers / num_estimators) with workers and estimators, else 1.
    """
    if num_workers > 0 and num_estimators > 0:
        return max(1, math.ceil(num_workers / num_estimators))
    return 1


def build_run(*, task_family: TaskFamily, learned_opt: LearnedOptimizer, trunc_sched: TruncationSchedule,
              estimators: Sequence[Callable], outer_opt: optax.GradientTransformation,
              meta_loss_split: Optional[str] = None, meta_loss_end_power: float = 0.0, copies: int = 1,
              theta_ema: Optional[float] = None, theta_init: Optional[str] = None,
              theta_init_changes: Sequence[str] = ()) -> tuple:
    """The GradientLearner and the estimators of a run (nothing is compiled).

    Args:
      task_family: the tasks meta-trained on.
      learned_opt: the learned optimizer meta-trained.
      trunc_sched: the inner episodes' truncation schedule.
      estimators: classes or factories taking the truncated step, one gradient estimator each.
      outer_opt: the optax optimizer of theta.
      meta_loss_split: the data split of the meta-loss (None: the normalised train loss).
      meta_loss_end_power: how much the meta-loss weighs the end of each episode
        (`LOptTruncatedStep`; 0: every step alike).
      copies: how many times the estimator list is repeated (each copy has its own particles).
      theta_ema: the learner's moving average of theta (`GradientLearner(theta_ema=...)`; None: none).
      theta_init: where meta-training starts (`load_theta_init`): "pretrained:NAME", a theta file or an
        outer_train checkpoint file (None: `learned_opt.init(key)`).
      theta_init_changes: config fields of `learned_opt` that may differ from `theta_init`'s
        (`load_theta_init`).

    Returns:
      (GradientLearner, [estimator, ...]) with `copies * len(estimators)` estimators, all on one
      `LOptTruncatedStep`.

    Raises:
      ValueError: `theta_init` cannot be read or is a theta of another architecture or config.
    """
    step = ot.LOptTruncatedStep(task_family, learned_opt, trunc_sched, meta_loss_split=meta_loss_split,
                                meta_loss_end_power=meta_loss_end_power)
    start = None if theta_init is None else load_theta_init(theta_init, learned_opt, theta_init_changes)
    learner = ot.GradientLearner(learned_opt, outer_opt, theta_init=start, theta_ema=theta_ema)
    return learner, [make(step) for _ in range(copies) for make in estimators]


def load_theta_init(spec: str, learned_opt: LearnedOptimizer, changes: Sequence[str] = ()) -> Any:
    """The theta a run starts from (fine-tuning a meta-trained optimizer): `train.theta_init = spec`.

    Args:
      spec: "pretrained:NAME" (`lopt.pretrained`; the theta as meta-trained, without deploy options),
        a theta file (`lopt.save_theta`) or a checkpoint file of an outer_train run (its result theta,
        the average where the run averaged theta).
      learned_opt: the run's learned optimizer; the file's must be the same architecture with the same
        config, so that theta means the same update rule.
      changes: config fields that may differ all the same (e.g. ("horizon_reference",
        "horizon_power"): meta-train a theta further under a changed option); theta must still have
        the shapes `learned_opt.init` gives, except that a top-level part of theta the file lacks (one
        a changed option adds, e.g. `Celo2LOpt.wd_learned`'s learned weight decay) starts at
        `learned_opt.init`'s value.

    Returns:
      the theta, a pytree shaped like `learned_opt.init`'s.

    Raises:
      ValueError: an unknown pretrained name, an unreadable file, a theta of another architecture, config
        (naming the config fields that differ, other than `changes`) or shapes, or a name in `changes`
        that is not a config field.
    """
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"train.theta_init must be 'pretrained:NAME' or a theta or checkpoint file path, got {spec!r}")
    if spec.startswith("pretrained:"):
        name = spec[len("pretrained:"):]
        if name not in pretrained.names():
            raise ValueError(f"train.theta_init = {spec!r}: no pretrained optimizer named {name!r}; "
                             f"pretrained.names() = {list(pretrained.names())}")
        saved_opt, theta = pretrained.load_learned_optimizer_by_name(name)
    else:
        try:
            saved_opt, theta = ot.theta_from_file(spec)
        except ValueError as e:
            raise ValueError(f"train.theta_init: {e} (give 'pretrained:NAME', a theta file or a checkpoint file)") from None
    if saved_opt.name != learned_opt.name:
        raise ValueError(f"train.theta_init = {spec!r} is a theta of {saved_opt.name}, but the run meta-trains "
                         f"{learned_opt.name}")
    fields = {f.name for f in dataclasses.fields(learned_opt)}
    unknown = sorted(set(changes) - fields)
    if unknown:
        raise ValueError(f"train.theta_init_changes names {unknown}, not config fields of {learned_opt.name} "
                         f"({sorted(fields)})")
    saved, run = saved_opt.config(), learned_opt.config()
    differ = sorted(k for k in set(saved) | set(run) if saved.get(k) != run.get(k) and k not in changes)
    if differ:
        raise ValueError(f"train.theta_init = {spec!r}: its {saved_opt.name} config differs from the run's in "
                         + ", ".join(f"{k} ({saved.get(k)!r} there, {run.get(k)!r} here)" for k in differ)
                         + "; bind the run's learned optimizer to the file's config, or name the fields in "
                         "train.theta_init_changes")
    if changes and isinstance(theta, dict):
        fresh = learned_opt.init(jax.random.key(0))
        if isinstance(fresh, dict):
            theta = {**{k: v for k, v in fresh.items() if k not in theta}, **theta}
    learned_opt.check_theta(theta, f"train.theta_init = {spec!r} (train.theta_init_changes = {list(changes)})")
    return theta


def make_meta_evaluator(learned_opt: LearnedOptimizer, task_family: TaskFamily, tasks: Optional[Sequence[Any]] = None,
                        *, num_tasks: int, num_steps: int, seed: int) -> ot.MetaEvaluator:
    """The run's periodic meta-evaluation: `learned_opt` on held-out draws of `tasks`.

    Args:
      learned_opt: the learned optimizer meta-trained.
      task_family: the family meta-trained on, evaluated when `tasks` is empty.
      tasks: Tasks or TaskFamilies to evaluate (None or empty: `[task_family]`).
      num_tasks: tasks drawn per evaluated family.
      num_steps: inner steps of each evaluation run.
      seed: the seed of the evaluation's task draws.

    Returns:
      the MetaEvaluator.
    """
    return ot.MetaEvaluator(learned_opt, list(tasks or [task_family]), num_tasks=num_tasks, num_steps=num_steps,
                            seed=seed)


def make_validation_selector(learned_opt: LearnedOptimizer, output_dir: str,
                             settings: Validation) -> ot.ValidationSelector:
    """The run's validation selection: `learned_opt` scored on a suite or on tasks, its baseline cached in `output_dir`.

    Args:
      learned_opt: the learned optimizer meta-trained.
      output_dir: the run's directory (the baseline's cache is `output_dir`/validation_baseline.json).
      settings: the validation tasks (a suite or Tasks/TaskFamilies), steps, seeds, baseline and its grid.

    Returns:
      the ValidationSelector (nothing trained yet).

    Raises:
      ValueError, TypeError: a bad setting, the message naming the `Validation` bindings.
    """
    try:
        return ot.ValidationSelector(learned_opt, settings.suite if settings.suite is not None else list(settings.tasks),
                                     cache_path=os.path.join(output_dir, VALIDATION_CACHE),
                                     **settings.selector_options())
    except (ValueError, TypeError) as e:
        raise type(e)(f"{e} (set by the Validation.* bindings)") from None


def check_output_dir(output_dir: str, policy: ot.CheckpointPolicy, metadata: dict, *, resume: bool,
                     overwrite: bool, extend: bool = False,
                     num_steps: Optional[int] = None) -> tuple[RunCheckpoints, bool]:
    """Decides whether the run may resume or start in `output_dir`, writing nothing (the module's policy).

    Args:
      output_dir: the run's directory.
      policy: when checkpoints are written and which are kept.
      metadata: what a resumed checkpoint must match (`learner.run_records.run_metadata`).
      resume: continue from the newest readable checkpoint; False starts a new run.
      overwrite: a new run may replace the results (`SCRIPT_RESULTS`) of an earlier run.
      extend: the run is trained further explicitly (see `outer_trainers.outer_train`): a `num_steps` below
        the steps taken is refused, horizon bindings in the config may change.
      num_steps: the run's length in outer steps, recorded in `metadata` as the loop records it (None: left
        out, so the check ignores the length).

    Returns:
      (run, starts_new): the directory's RunCheckpoints, and whether the run starts new (True) or
      resumes (False).

    Raises:
      ExistingRunError: a new run over an earlier run's results without `overwrite`.
      ValueError: the newest checkpoint belongs to a different run (the differences named), or `extend`
        asks for fewer steps than the run has taken.
    """
    meta = metadata if num_steps is None else dict(metadata, num_steps=num_steps)
    run = RunCheckpoints(output_dir, policy, meta, results=SCRIPT_RESULTS, fixed_length=False)
    return run, run.check_start(resume=resume, overwrite=overwrite, extend=extend) is None


def prepare_output_dir(run: RunCheckpoints, *, starts_new: bool, overwrite: bool,
                       config_text: Optional[str] = None) -> None:
    """The run's first writes, once `check_output_dir` let it start or resume.

    Args:
      run: the RunCheckpoints `check_output_dir` returned.
      starts_new: whether the run starts new (`check_output_dir`'s answer).
      overwrite: delete an earlier run's results (config.gin and comparison.md included) before a new run.
      config_text: written to `CONFIG_FILE` in the output directory (None: not written).
    """
    if starts_new and overwrite:
        run.clear_results()
    if config_text is not None:
        atomic_write_bytes(os.path.join(run.output_dir, CONFIG_FILE), config_text.encode("utf-8"))


def meta_train_locally(learner: ot.GradientLearner, estimators: Sequence[ot.GradientEstimator], num_steps: int, *,
                       weights: Optional[Sequence[float]] = None, meta_evaluator: Optional[ot.MetaEvaluator] = None,
                       eval_every: int = 0, **loop_options: Any) -> ot.OuterTrainState:
    """Meta-trains in this process: `outer_trainers.outer_train`.

    The loop is looked up on the `outer_trainers` package when called, so `outer_trainers.outer_train`
    replaced (e.g. by a test capturing the built estimators) is what runs.

    Args:
      learner: the run's GradientLearner.
      estimators: the run's estimators.
      num_steps: outer steps.
      weights: the estimators' weights in the averaged gradient (None: equal).
      meta_evaluator: the periodic meta-evaluation (None: none).
      eval_every: outer steps between meta-evaluations (0: none).
      **loop_options: the other options of `outer_train` (output_dir, seed, reporting (a
        `run_settings.Reporting`), checkpoint_policy, resume, extend, config, validation, validation_every, ...).

    Returns:
      the final OuterTrainState.
    """
    return ot.outer_train(learner, estimators, num_steps, weights=weights, meta_evaluator=meta_evaluator,
                          eval_every=eval_every, **loop_options)


def compare_with_adam(task_family: TaskFamily, learned_opt: LearnedOptimizer, theta: Any, output_dir: str,
                      settings: Comparison, *, seed: int) -> str:
    """Compares the meta-trained optimizer with tuned Adam on held-out tasks; prints and saves the table.

    `compare_optimizers` on `settings.num_tasks` draws of `task_family` (key: `seed + COMPARISON_SEED_OFFSET`),
    every optimizer running `settings.num_steps` inner steps (the learned one with that horizon). The table
    is printed under its title and written to `COMPARISON_FILE` in `output_dir`.

    Args:
      task_family: the family meta-trained on, drawn again for held-out tasks.
      learned_opt: the learned optimizer meta-trained.
      theta: its meta-trained parameters (a run's `final_theta`).
      output_dir: where `COMPARISON_FILE` goes.
      settings: the held-out tasks (the protocol's seeds), inner steps of each run, Adam's learning-rate
        grid (extended past an edge holding the best rate) and its schedule over those steps.
      seed: the run's seed.

    Returns:
      the Markdown written to `COMPARISON_FILE`.
    """
    num_tasks, num_steps = settings.num_tasks, settings.num_steps
    results = ot.compare_optimizers(
        task_family, lambda th: learned_opt.opt_fn(th, num_steps=num_steps), theta, num_tasks=num_tasks,
        num_steps=num_steps, key=jax.random.key(seed + COMPARISON_SEED_OFFSET), adam_lrs=settings.adam_lrs,
        adam_schedule=settings.adam_schedule)
    table = ot.format_comparison(results, num_steps)
    title = f"Held-out {task_family.name} tasks ({num_tasks} tasks, same inner steps)"
    print(f"\n{title}\n{table}")
    text = f"# {title}\n\n{table}\n"
    atomic_write_bytes(os.path.join(output_dir, COMPARISON_FILE), text.encode("utf-8"))
    return text

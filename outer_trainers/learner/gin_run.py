"""The gin-configured meta-training run: `train`, and `GinRun`, the description Ray workers rebuild it from.

    from outer_trainers.gin_registry import load_config
    from outer_trainers.learner.gin_run import train
    load_config(["scripts/configs/quickstart.gin"], ["train.num_steps = 20", "Reporting.log_every = 5"])
    state = train("runs/quickstart")

`train` is registered with gin as `train`: its parameters say what is meta-trained and for how
long (`train.task_family`, `train.estimators`, `train.num_steps`, `train.seed`, ...). The rest of a
run's settings are groups, each a frozen dataclass that `train` builds from its own gin bindings:
`MetaEval.*`, `Comparison.*`, `Validation.*`, `Reporting.*` (`learner.run_settings`) and
`CheckpointPolicy.*`. Importing this module registers `train` and `clipped_outer_opt`, and the
public API and the settings groups through `gin_registry`. `train` runs the steps of
`learner.meta_training_run` in order.

With Ray workers (`train.num_workers > 0`) the run is handed what runs them, `train.workers` (an
`outer_trainers.distributed.RayWorkers`, its settings bound as `RayWorkers.*`; scripts/outer_train.py
passes one), so this module imports nothing of distributed/. Each worker rebuilds the learner and
estimators from `GinRun(config_text, copies)`, which pickles as the run's gin text: unpickling it in
a worker imports this module (so `train` is registered there) and the worker parses the text
itself. A worker needs the installed packages only, nothing from scripts/. The learner's process
hands the run it built to `GinRun(..., built=...)`, so `theta_init` is read once, there; workers
build their estimators alone (`GinRun.worker_estimators`) and get theta from the learner. The
evaluation actor builds the meta-evaluation (`GinEvaluator`) and the validation selection
(`GinValidation`) from the same text, so `theta_ema`, `MetaEval.*` and `Validation.*` work with
Ray workers as they do locally.

Besides `gin_registry`, this is the one module of the package that imports gin; `import
outer_trainers` imports neither.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable, Optional, Sequence

import gin
import optax

import outer_trainers as ot
from lopt.base import LearnedOptimizer
from outer_trainers import gin_registry  # noqa: F401  (registers the public API with gin)
from outer_trainers.gin_registry import SETTINGS_GROUPS, gin_bindings
from outer_trainers.learner.meta_training_run import (build_run, check_output_dir, check_run_arguments,
                                                      compare_with_adam, make_meta_evaluator, make_validation_selector,
                                                      meta_train_locally, prepare_output_dir, worker_copies)
from outer_trainers.learner.run_records import run_metadata
from outer_trainers.learner.run_settings import Comparison, MetaEval, Reporting, Validation
from outer_trainers.learner.theta_best import best_score_on_disk
from outer_trainers.runs.checkpoint_policy import CheckpointPolicy
from outer_trainers.steps.truncation_schedule import TruncationSchedule
from tasks.base import TaskFamily

# Bindings left out of the config a resume compares (the settings groups: logging, evaluation, validation, saving,
# workers; the run-directory switches; and the length, which the checkpoints record as num_steps, changed only with
# train.extend): every other binding must match. (Validation settings that differ from those theta_best.json was
# selected with are refused by the run itself.)
RESUME_SAFE = (("train.num_steps", "train.resume", "train.overwrite", "train.extend", "train.num_workers",
                "train.workers") + tuple(f"{module}{name}." for name in SETTINGS_GROUPS
                                         for module in ("", "outer_trainers.")))
# the arguments of `train` that describe the run's learner and estimators (what `GinRun` rebuilds on a worker)
RUN_ARGS = ("task_family", "learned_opt", "trunc_sched", "estimators", "outer_opt", "meta_loss_split",
            "meta_loss_end_power", "theta_ema", "theta_init", "theta_init_changes")


@gin.configurable
def clipped_outer_opt(opt: optax.GradientTransformation = gin.REQUIRED,
                      max_norm: float = 1.0) -> optax.GradientTransformation:
    """An outer optimizer that clips the meta-gradient's global norm first: `train.outer_opt = @clipped_outer_opt()`.

    A shorthand for `outer_trainers.chained([optax.clip_by_global_norm(max_norm), opt])` (gin
    cannot bind `optax.chain`'s varargs; `chained` takes any list of transforms).

    Args:
      opt: the outer optimizer that follows the clipping.
      max_norm: the largest global norm of the meta-gradient.

    Returns:
      the chained optax transform.
    """
    return ot.chained([optax.clip_by_global_norm(max_norm), opt])


class GinRun:
    """A picklable run description for Ray workers: `GinRun(config_text, copies)()` -> (learner, estimators).

    Only the text is pickled, nothing built or jitted. In a process whose gin config binds
    `train` (the driver) it builds from that config; in one where nothing binds `train` yet (a
    fresh Ray worker) it parses `config_text` first.

    Args:
      config_text: the run's gin config (`gin.config_str()`).
      copies: how many times the estimator list is repeated (see `meta_training_run.build_run`).
      built: the (learner, estimators) this process built from the same config, returned by calls here
        (so `theta_init` is not read again); not pickled.
    """

    def __init__(self, config_text: str, copies: int = 1, built: Optional[tuple] = None):
        self.config_text, self.copies, self.built = config_text, int(copies), built

    def __getstate__(self) -> dict:
        return {"config_text": self.config_text, "copies": self.copies}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["config_text"], state["copies"])

    def bindings(self) -> dict:
        """`train`'s bindings, references resolved (parsing `config_text` first where nothing binds `train`).

        Returns:
          {argument name: value} of the bindings of `train`.
        """
        if not gin.get_bindings("train", resolve_references=False):
            with gin.unlock_config():
                gin.parse_config(self.config_text)
        return gin.get_bindings("train")

    def __call__(self) -> tuple:
        """(GradientLearner, [estimator, ...]) of the run (see `meta_training_run.build_run`): `built` when given."""
        if self.built is not None:
            return self.built
        b = self.bindings()
        return build_run(**{k: b[k] for k in RUN_ARGS if k in b}, copies=self.copies)

    def worker_estimators(self) -> list:
        """The run's estimators alone, as a Ray worker builds them: without reading `theta_init` (the worker's
        theta comes from the learner) or averaging theta.

        Returns:
          [estimator, ...], the same list `__call__` gives.
        """
        b = self.bindings()
        args = {k: b[k] for k in RUN_ARGS if k in b and k not in ("theta_init", "theta_init_changes", "theta_ema")}
        return build_run(**args, copies=self.copies)[1]


class GinEvaluator:
    """A picklable factory of the run's MetaEvaluator for an evaluation actor: `GinEvaluator(run)()`.

    Args:
      run: the run's GinRun (its config gives the learned optimizer, the task family and the `MetaEval`
        bindings: the tasks, their number, inner steps and seed).
    """

    def __init__(self, run: GinRun):
        self.run = run

    def __call__(self) -> ot.MetaEvaluator:
        """The MetaEvaluator of `MetaEval.tasks` (default: the task family)."""
        b = self.run.bindings()
        return meta_evaluator(b["learned_opt"], b["task_family"], configured(MetaEval))


class GinValidation:
    """A picklable factory of the run's ValidationSelector for an evaluation actor: `GinValidation(run, dir)()`.

    Args:
      run: the run's GinRun (its config gives the learned optimizer and the `Validation` bindings).
      output_dir: the run's directory (the selector's cache path names it; the actor writes no file).
      built: the selector this process built from the same config, returned by calls here; not pickled.
    """

    def __init__(self, run: GinRun, output_dir: str, built: Any = None):
        self.run, self.output_dir, self.built = run, output_dir, built

    def __getstate__(self) -> dict:
        return {"run": self.run, "output_dir": self.output_dir}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["run"], state["output_dir"])

    def __call__(self) -> ot.ValidationSelector:
        """The ValidationSelector of the `Validation` bindings (`meta_training_run.make_validation_selector`)."""
        if self.built is not None:
            return self.built
        b = self.run.bindings()
        return make_validation_selector(b["learned_opt"], self.output_dir, configured(Validation))


def configured(group: type) -> Any:
    """A settings group built from its gin bindings (`configured(MetaEval)`: `MetaEval.every = 100`, ...).

    Args:
      group: a settings class registered with gin (`gin_registry.SETTINGS_GROUPS`).

    Returns:
      the instance, its fields as bound (unbound ones: the class's defaults).
    """
    return gin.get_configurable(group)()


def meta_evaluator(learned_opt: LearnedOptimizer, task_family: TaskFamily, settings: MetaEval) -> ot.MetaEvaluator:
    """The run's periodic meta-evaluation as `settings` describe it (`meta_training_run.make_meta_evaluator`)."""
    return make_meta_evaluator(learned_opt, task_family, settings.tasks, num_tasks=settings.num_tasks,
                               num_steps=settings.num_steps, seed=settings.seed)


@gin.configurable
def train(output_dir: str, *, task_family: TaskFamily = gin.REQUIRED, learned_opt: LearnedOptimizer = gin.REQUIRED,
          trunc_sched: TruncationSchedule = gin.REQUIRED, estimators: Sequence[Callable] = gin.REQUIRED,
          estimator_weights: Optional[Sequence[float]] = None, outer_opt: optax.GradientTransformation = gin.REQUIRED,
          meta_loss_split: Optional[str] = None, meta_loss_end_power: float = 0.0, num_steps: int = 100, seed: int = 0,
          theta_ema: Optional[float] = None, theta_init: Optional[str] = None, theta_init_changes: Sequence[str] = (),
          num_workers: int = 0, workers: Any = None, resume: bool = True, overwrite: bool = False,
          extend: bool = False, config_text: Optional[str] = None) -> ot.OuterTrainState:
    """Meta-trains `learned_opt` on `task_family`, then optionally compares it with Adam.

    The steps of `learner.meta_training_run`, in order: checks the arguments, builds the
    `LOptTruncatedStep` and the estimators, checks whether the run may start or resume in
    `output_dir` (nothing is written before), connects to Ray when meta-training on workers,
    writes the run's gin config to config.gin, meta-trains (in this process, or on `num_workers` Ray
    workers that rebuild the run from its gin config), checkpointing and resuming in `output_dir`,
    meta-evaluating and validating (keeping theta_best) as the settings groups say, and, when
    `Comparison.num_tasks` > 0, prints and writes comparison.md: `compare_optimizers` on held-out tasks.

    The settings besides these arguments are groups built from their gin bindings (`configured`):

      MetaEval          periodic meta-evaluation: every, tasks, num_tasks, num_steps, seed
      Comparison        the final comparison with tuned Adam: num_tasks, num_steps, adam_lrs, adam_schedule
      Validation        theta_best on validation tasks: every, suite, tasks, num_steps, num_seeds, baseline,
                        lrs, max_extensions
      CheckpointPolicy  every_steps, every_seconds (default 600), keep, checkpoints_at, permanent_every,
                        best_metric (default here "eval/final_loss" when meta-evaluating), best_mode,
                        keep_best; best checkpoints only while meta-evaluation or validation runs
      Reporting         progress ("auto": a bar on a terminal, else a line every few seconds), log_every,
                        tensorboard, max_consecutive_dropped

    (the fields' meanings: `learner.run_settings`, `runs.checkpoint_policy`).

    Args:
      output_dir: where metrics, TensorBoard summaries, checkpoints, theta and reports go.
      task_family: the tasks meta-trained on.
      learned_opt: the learned optimizer meta-trained.
      trunc_sched: the inner episodes' truncation schedule.
      estimators: classes or factories taking the truncated step, one gradient estimator each.
      estimator_weights: the estimators' weights in the averaged gradient (default: equal).
      outer_opt: the optax optimizer of theta.
      meta_loss_split: the data split of the meta-loss (None: the normalised train loss).
      meta_loss_end_power: p, how much the meta-loss weighs the end of each inner episode: step t of T counts
        (p + 1) · (t / T)^p times (`LOptTruncatedStep`; 0, the default: every step alike).
      num_steps: outer steps.
      seed: the run's PRNG seed (the comparison uses seed + 10000).
      theta_ema: keep a moving average of theta with this decay (e.g. 0.99; `GradientLearner(theta_ema=...)`)
        and use it as the run's result: theta_final.msgpack (the last theta goes to theta_last.msgpack),
        meta-evaluation, validation and the comparison with Adam. None (default): no average, the last theta
        is the result (with Ray workers too: the learner keeps the average).
      theta_init: start meta-training from a meta-trained theta instead of `learned_opt.init(key)`:
        "pretrained:NAME", a theta file or an outer_train checkpoint file, of the same architecture and
        config as `learned_opt` (`learner.meta_training_run.load_theta_init`). A resume continues from its
        checkpoint as always.
      theta_init_changes: config fields of `learned_opt` that may differ from `theta_init`'s, e.g.
        ["horizon_reference", "horizon_power"] to meta-train a shipped theta further under a new option
        (its theta must keep its shapes).
      num_workers: Ray worker actors (0: train in this process); see `outer_trainers.ray_outer_train`.
        With more workers than estimators the estimator list is repeated (`worker_copies`).
      workers: with `num_workers` > 0, what runs the workers: an `outer_trainers.distributed.RayWorkers`
        (asynchronous mode, cluster address, ...; `train.workers = @RayWorkers()` in gin); unused otherwise.
      resume: continue from the newest readable checkpoint in `output_dir`; False starts a new run (refused
        where `output_dir` holds results, unless `overwrite`).
      overwrite: start a new run, first deleting the results (SCRIPT_RESULTS) of any run in `output_dir`.
      extend: train the run in `output_dir` further, explicitly: a `num_steps` below the steps it has taken
        is refused, and horizon bindings (`runs.run_extension.is_horizon_binding`, e.g. an outer
        learning-rate schedule's `decay_steps`) may change with the length; everything else must match.
        (A larger `num_steps` alone resumes a finished run further without it too: meta-training's length
        is resume-safe.) The state continues from the checkpoint (`outer_trainers.outer_train` says how
        each schedule continues) and the extension is recorded in the checkpoints' config history.
      config_text: the run's gin config (None: `gin.config_str()`): written to `output_dir`/config.gin once
        the start or resume check passed, its bindings (less `RESUME_SAFE`) stored with the checkpoints, which
        a resume must match, and rebuilt by Ray workers.

    Returns:
      the final `OuterTrainState`.
    """
    meta_eval, comparison, validation = configured(MetaEval), configured(Comparison), configured(Validation)
    reporting, policy = configured(Reporting), configured(CheckpointPolicy)
    check_run_arguments(num_workers=num_workers, workers=workers)
    config_text = gin.config_str() if config_text is None else config_text
    copies = worker_copies(num_workers, len(estimators))
    learner, ests = build_run(task_family=task_family, learned_opt=learned_opt, trunc_sched=trunc_sched,
                              estimators=estimators, outer_opt=outer_opt, meta_loss_split=meta_loss_split,
                              meta_loss_end_power=meta_loss_end_power, copies=copies, theta_ema=theta_ema,
                              theta_init=theta_init, theta_init_changes=theta_init_changes)
    on_ray = num_workers > 0
    evaluator = None
    if meta_eval.every > 0 and not on_ray:  # on Ray an evaluation actor builds its own (GinEvaluator)
        evaluator = meta_evaluator(learned_opt, task_family, meta_eval)
    selector = None
    if validation.every > 0:  # builds the tasks (loading their data) and checks the settings; trains nothing
        selector = make_validation_selector(learned_opt, output_dir, validation)
    policy = checkpoint_policy(policy, meta_eval, validation)
    config = {"gin_bindings": gin_bindings(config_text, ignore=RESUME_SAFE)}
    run, starts_new = check_output_dir(output_dir, policy, run_metadata(learner, ests, config), resume=resume,
                                       overwrite=overwrite, extend=extend, num_steps=num_steps)
    if selector is not None and not (starts_new and overwrite):  # a record of other validation settings is
        best_score_on_disk(output_dir, selector)                  # refused here, before config.gin is written
    loop_options = dict(output_dir=output_dir, seed=seed, checkpoint_policy=policy, resume=resume, extend=extend,
                        config=config)
    # a bad Ray address fails here, before the first write
    with workers.connection() if on_ray else contextlib.nullcontext():
        prepare_output_dir(run, starts_new=starts_new, overwrite=overwrite, config_text=config_text)
        if on_ray:
            make_run = GinRun(config_text, copies, built=(learner, ests))  # theta_init read once, here
            make_eval = GinEvaluator(make_run) if meta_eval.every > 0 else None
            make_valid = GinValidation(make_run, output_dir, built=selector) if selector is not None else None
            state = workers.meta_train(make_run, num_steps, num_workers=num_workers, copies=copies,
                                       weights=estimator_weights, make_evaluator=make_eval,
                                       eval_every=meta_eval.every, make_validation=make_valid,
                                       validation_every=validation.every, **loop_options, **reporting.loop_options())
        else:
            state = meta_train_locally(learner, ests, num_steps, weights=estimator_weights, meta_evaluator=evaluator,
                                       eval_every=meta_eval.every, validation=selector,
                                       validation_every=validation.every, reporting=reporting, **loop_options)
        if comparison.num_tasks > 0:
            compare_with_adam(task_family, learned_opt, state.final_theta, output_dir, comparison, seed=seed)
    return state


def checkpoint_policy(policy: CheckpointPolicy, meta_eval: MetaEval, validation: Validation) -> CheckpointPolicy:
    """The run's checkpoint policy: "best" checkpoints by `policy.best_metric` only while an evaluation logs it.

    Args:
      policy: the bound `CheckpointPolicy`.
      meta_eval: the run's meta-evaluation settings.
      validation: the run's validation settings.

    Returns:
      `policy` with `best_metric` "eval/final_loss" where it is unset and meta-evaluation runs, and None where
      neither meta-evaluation nor validation runs.
    """
    if meta_eval.every == 0 and validation.every == 0:
        return dataclasses.replace(policy, best_metric=None)
    if policy.best_metric is None and meta_eval.every > 0:
        return dataclasses.replace(policy, best_metric="eval/final_loss")
    return policy

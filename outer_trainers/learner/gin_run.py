"""The gin-configured meta-training run: `train`, and `GinRun`, the description Ray workers rebuild it from.

    from outer_trainers.gin_registry import load_config
    from outer_trainers.learner.gin_run import train
    load_config(["scripts/configs/quickstart.gin"], ["train.num_steps = 20"])
    state = train("runs/quickstart")

`train` is registered with gin as `train` (gin files bind `train.num_steps = ...`), and
`clipped_outer_opt` as `clipped_outer_opt`; importing this module registers them, and the public
API through `gin_registry`. `train` runs the steps of `learner.meta_training_run` in order.

With Ray workers (`train.num_workers > 0`), each worker rebuilds the learner and estimators from
`GinRun(config_text, copies)`, which pickles as the run's gin text: unpickling it in a worker
imports this module (so `train` is registered there) and the worker parses the text itself. A
worker needs the installed packages only, nothing from scripts/.

Besides `gin_registry`, this is the one module of the package that imports gin; `import
outer_trainers` imports neither.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Optional, Sequence, Union

import gin
import optax

import outer_trainers as ot
from lopt.base import LearnedOptimizer
from outer_trainers import gin_registry  # noqa: F401  (registers the public API with gin)
from outer_trainers.distributed.cluster import ray_connection
from outer_trainers.learner.meta_training_run import (build_run, check_output_dir, check_run_arguments,
                                                      compare_with_adam, make_meta_evaluator, make_validation_selector,
                                                      meta_train_locally, meta_train_on_ray, prepare_output_dir,
                                                      worker_copies)
from outer_trainers.learner.run_records import run_metadata
from outer_trainers.learner.theta_best import best_score_on_disk
from outer_trainers.runs.reporting import DEFAULT_MAX_CONSECUTIVE_DROPPED
from outer_trainers.steps.truncation_schedule import TruncationSchedule
from tasks.base import TaskFamily

# Bindings left out of the config a resume compares (logging, evaluation, saving, workers; and the length, which
# the checkpoints record as num_steps, changed only with train.extend): every other binding must match. (Validation
# settings that differ from those theta_best.json was selected with are refused by the run itself.)
RESUME_SAFE = ("train.num_steps", "train.max_consecutive_dropped", "train.progress", "train.log_every",
               "train.tensorboard", "train.resume", "train.overwrite", "train.extend", "train.eval_",
               "train.meta_eval_", "train.checkpoint", "train.keep_", "train.permanent_", "train.best_", "train.num_workers",
               "train.max_staleness", "train.num_estimates_per_step", "train.validation_")
# the arguments of `train` that describe the run's learner and estimators (what `GinRun` rebuilds on a worker)
RUN_ARGS = ("task_family", "learned_opt", "trunc_sched", "estimators", "outer_opt", "meta_loss_split", "theta_ema",
            "theta_init", "theta_init_changes")


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
    """

    def __init__(self, config_text: str, copies: int = 1):
        self.config_text, self.copies = config_text, int(copies)

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
        """(GradientLearner, [estimator, ...]) of the run (see `meta_training_run.build_run`)."""
        b = self.bindings()
        return build_run(**{k: b[k] for k in RUN_ARGS if k in b}, copies=self.copies)


class GinEvaluator:
    """A picklable factory of the run's MetaEvaluator for an evaluation actor: `GinEvaluator(run, ...)()`.

    Args:
      run: the run's GinRun (its config gives the learned optimizer, `train.meta_eval_tasks` and
        the default task family).
      num_tasks: tasks drawn per meta-evaluated family.
      num_steps: inner steps of each meta-evaluation run.
      seed: the seed of the meta-evaluation task draws.
    """

    def __init__(self, run: GinRun, num_tasks: int, num_steps: int, seed: int):
        self.run, self.num_tasks, self.num_steps, self.seed = run, num_tasks, num_steps, seed

    def __call__(self) -> ot.MetaEvaluator:
        """The MetaEvaluator of `train.meta_eval_tasks` (default: the task family)."""
        b = self.run.bindings()
        return make_meta_evaluator(b["learned_opt"], b["task_family"], b.get("meta_eval_tasks"),
                                   num_tasks=self.num_tasks, num_steps=self.num_steps, seed=self.seed)


@gin.configurable
def train(output_dir: str, *, task_family: TaskFamily = gin.REQUIRED, learned_opt: LearnedOptimizer = gin.REQUIRED,
          trunc_sched: TruncationSchedule = gin.REQUIRED, estimators: Sequence[Callable] = gin.REQUIRED,
          estimator_weights: Optional[Sequence[float]] = None, outer_opt: optax.GradientTransformation = gin.REQUIRED,
          num_steps: int = 100, seed: int = 0, meta_loss_split: Optional[str] = None,
          theta_ema: Optional[float] = None, theta_init: Optional[str] = None,
          theta_init_changes: Sequence[str] = (), eval_num_tasks: int = 0, eval_num_steps: int = 200,
          eval_adam_lrs: Sequence[float] = (1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1, 1.0),
          progress: Union[bool, str] = True, log_every: int = 1, tensorboard: bool = True, resume: bool = True,
          overwrite: bool = False, extend: bool = False,
          max_consecutive_dropped: Optional[int] = DEFAULT_MAX_CONSECUTIVE_DROPPED,
          checkpoint_every_steps: Optional[int] = None, checkpoint_every_seconds: Optional[float] = 600.0,
          keep_checkpoints: int = 3, checkpoints_at: Sequence[int] = (),
          permanent_checkpoint_every: Optional[int] = None,
          best_metric: Optional[str] = "eval/final_loss", best_mode: str = "min", keep_best: int = 1,
          meta_eval_every: int = 0, meta_eval_tasks: Optional[Sequence[Any]] = None, meta_eval_num_tasks: int = 4,
          meta_eval_num_steps: int = 100, meta_eval_seed: int = 12345,
          validation_every: int = 0, validation_suite: Optional[str] = None,
          validation_tasks: Optional[Sequence[Any]] = None, validation_num_steps: Optional[int] = None,
          validation_num_seeds: Optional[int] = None, validation_baseline: str = "adam",
          validation_lrs: Optional[Sequence[float]] = None, validation_max_extensions: int = 4,
          num_workers: int = 0, max_staleness: int = 0, num_estimates_per_step: Optional[int] = None,
          ray_address: Optional[str] = None,
          config: Optional[dict] = None, config_text: Optional[str] = None) -> ot.OuterTrainState:
    """Meta-trains `learned_opt` on `task_family`, then optionally compares it with Adam.

    The steps of `learner.meta_training_run`, in order: checks the arguments, builds the
    `LOptTruncatedStep` and the estimators, checks whether the run may start or resume in
    `output_dir` (nothing is written before), connects to Ray when meta-training on workers,
    writes `config_text` to config.gin, meta-trains (in this process, or on `num_workers` Ray
    workers that rebuild the run from its gin config), checkpointing and resuming in `output_dir`
    and meta-evaluating every `meta_eval_every` steps (validating every `validation_every` steps, keeping
    theta_best), and, when `eval_num_tasks` > 0, prints and
    writes comparison.md: `compare_optimizers` on held-out tasks.

    Args:
      output_dir: where metrics, TensorBoard summaries, checkpoints, theta and reports go.
      task_family: the tasks meta-trained on.
      learned_opt: the learned optimizer meta-trained.
      trunc_sched: the inner episodes' truncation schedule.
      estimators: classes or factories taking the truncated step, one gradient estimator each.
      estimator_weights: the estimators' weights in the averaged gradient (default: equal).
      outer_opt: the optax optimizer of theta.
      num_steps: outer steps.
      seed: the run's PRNG seed (the comparison uses seed + 10000).
      meta_loss_split: the data split of the meta-loss (None: the normalised train loss).
      theta_ema: keep a moving average of theta with this decay (e.g. 0.99; `GradientLearner(theta_ema=...)`)
        and use it as the run's result: theta_final.msgpack (the last theta goes to theta_last.msgpack),
        meta-evaluation and the comparison with Adam. None (default): no average, the last theta is the result.
        Local runs only (refused with `num_workers` > 0).
      theta_init: start meta-training from a meta-trained theta instead of `learned_opt.init(key)`:
        "pretrained:NAME", a theta file or an outer_train checkpoint file, of the same architecture and
        config as `learned_opt` (`learner.meta_training_run.load_theta_init`). A resume continues from its
        checkpoint as always.
      theta_init_changes: config fields of `learned_opt` that may differ from `theta_init`'s, e.g.
        ["horizon_reference", "horizon_power"] to meta-train a shipped theta further under a new option
        (its theta must keep its shapes).
      eval_num_tasks: held-out tasks of the final comparison with Adam (0: none).
      eval_num_steps: inner steps of each comparison run.
      eval_adam_lrs: Adam's learning-rate grid in the comparison.
      progress: True or "bar" (tqdm), "log" (plain lines, for log files), False or "none".
      log_every: outer steps between metrics lines.
      tensorboard: also write TensorBoard summaries.
      resume: continue from the newest readable checkpoint in `output_dir`; False starts a new run (refused
        where `output_dir` holds results, unless `overwrite`).
      overwrite: start a new run, first deleting the results (SCRIPT_RESULTS) of any run in `output_dir`.
      extend: train the run in `output_dir` further, explicitly: a `num_steps` below the steps it has taken
        is refused, and horizon bindings (`runs.run_extension.is_horizon_binding`, e.g. an outer
        learning-rate schedule's `decay_steps`) may change with the length; everything else must match.
        (A larger `num_steps` alone resumes a finished run further without it too: meta-training's length
        is resume-safe.) The state continues from the checkpoint (`outer_trainers.outer_train` says how
        each schedule continues) and the extension is recorded in the checkpoints' config history.
      max_consecutive_dropped: stop with `outer_trainers.MetaTrainingDiverged` after this many outer steps in
        a row that applied no estimate (every estimate non-finite or without a valid inner step); None: never.
      checkpoint_every_steps: outer steps between checkpoints (None: not by steps).
      checkpoint_every_seconds: seconds between checkpoints (None: not by time).
      keep_checkpoints: how many recent checkpoints to keep.
      checkpoints_at: outer steps that always get a kept checkpoint.
      permanent_checkpoint_every: keep every checkpoint at a multiple of this step (None: none).
      best_metric: the meta-evaluation metric that picks "best" checkpoints (used when meta-evaluation runs).
      best_mode: "min" or "max": which `best_metric` value is best.
      keep_best: how many best checkpoints to keep.
      meta_eval_every: outer steps between meta-evaluations (0: none).
      meta_eval_tasks: Tasks or TaskFamilies meta-evaluated (None: `task_family`).
      meta_eval_num_tasks: tasks drawn per meta-evaluated family.
      meta_eval_num_steps: inner steps of each meta-evaluation run.
      meta_eval_seed: the seed of the meta-evaluation task draws.
      validation_every: outer steps between validations of the run's result theta (0: none); each scores it
        on the validation tasks against the tuned baseline (`outer_trainers.ValidationSelector`, its
        baseline cached in `output_dir`/validation_baseline.json), logs the "valid/" metrics and writes
        theta_best.msgpack and theta_best.json when the score improves. Local runs only (refused with
        `num_workers` > 0). To keep "best" checkpoints by it too: `best_metric = "valid/score"`, `best_mode = "max"`.
      validation_suite: the validation tasks as a `tasks.suites` name (e.g. "smoke", "validation-cpu").
      validation_tasks: Tasks or TaskFamilies to validate on instead of a suite.
      validation_num_steps: inner steps of each validation run (None: a suite task's own budget; 100 for
        `validation_tasks`).
      validation_num_seeds: seeds per validation task (None: a suite task's own seeds; 3 for `validation_tasks`).
      validation_baseline: the tuned baseline ("adam", "adamw", "muon" or "sgdm").
      validation_lrs: its starting learning-rate grid, >= 7 rates (None: the protocol's default grid).
      validation_max_extensions: the most extensions of that grid past an edge holding the best rate.
      num_workers: Ray worker actors (0: train in this process); see `outer_trainers.ray_outer_train`.
        With more workers than estimators the estimator list is repeated (`worker_copies`).
      max_staleness: with workers: the most updates an applied estimate's theta may lag behind (0 and
        `num_estimates_per_step` None: synchronous mode, equal to the local run).
      num_estimates_per_step: with workers: estimates per update in asynchronous mode (None: all estimators).
      ray_address: with workers: the Ray cluster ("auto", "host:port"; None: a local Ray instance).
      config: the run's config, stored with checkpoints; a resume refuses a different one.
      config_text: written to `output_dir`/config.gin once the start or resume check passed (None: not
        written); Ray workers rebuild the run from it (None: from `gin.config_str()`).

    Returns:
      the final `OuterTrainState`.
    """
    check_run_arguments(eval_num_tasks=eval_num_tasks, eval_num_steps=eval_num_steps, eval_adam_lrs=eval_adam_lrs,
                        num_workers=num_workers, theta_ema=theta_ema, validation_every=validation_every,
                        validation_suite=validation_suite, validation_tasks=validation_tasks)
    copies = worker_copies(num_workers, len(estimators))
    learner, ests = build_run(task_family=task_family, learned_opt=learned_opt, trunc_sched=trunc_sched,
                              estimators=estimators, outer_opt=outer_opt, meta_loss_split=meta_loss_split,
                              copies=copies, theta_ema=theta_ema, theta_init=theta_init,
                              theta_init_changes=theta_init_changes)
    on_ray = num_workers > 0
    evaluator = None
    if meta_eval_every > 0 and not on_ray:  # on Ray an evaluation actor builds its own (GinEvaluator)
        evaluator = make_meta_evaluator(learned_opt, task_family, meta_eval_tasks, num_tasks=meta_eval_num_tasks,
                                        num_steps=meta_eval_num_steps, seed=meta_eval_seed)
    selector = None
    if validation_every > 0:  # builds the tasks (loading their data) and checks the settings; trains nothing
        selector = make_validation_selector(learned_opt, output_dir, suite=validation_suite, tasks=validation_tasks,
                                            num_steps=validation_num_steps, num_seeds=validation_num_seeds,
                                            baseline=validation_baseline, lrs=validation_lrs,
                                            max_extensions=validation_max_extensions)
    policy = ot.CheckpointPolicy(every_steps=checkpoint_every_steps, every_seconds=checkpoint_every_seconds,
                                 keep=keep_checkpoints, checkpoints_at=tuple(checkpoints_at),
                                 permanent_every=permanent_checkpoint_every,
                                 best_metric=best_metric if meta_eval_every > 0 or validation_every > 0 else None,
                                 best_mode=best_mode, keep_best=keep_best)
    run, starts_new = check_output_dir(output_dir, policy, run_metadata(learner, ests, config), resume=resume,
                                       overwrite=overwrite, extend=extend, num_steps=num_steps)
    if selector is not None and not (starts_new and overwrite):  # a record of other validation settings is
        best_score_on_disk(output_dir, selector)                  # refused here, before config.gin is written
    loop_options = dict(output_dir=output_dir, seed=seed, progress=progress, log_every=log_every,
                        checkpoint_policy=policy, resume=resume, extend=extend, tensorboard=tensorboard,
                        config=config, max_consecutive_dropped=max_consecutive_dropped)
    # a bad Ray address fails here, before the first write
    with ray_connection(ray_address) if on_ray else contextlib.nullcontext():
        prepare_output_dir(run, starts_new=starts_new, overwrite=overwrite, config_text=config_text)
        if on_ray:
            make_run = GinRun(config_text if config_text is not None else gin.config_str(), copies)
            make_eval = GinEvaluator(make_run, meta_eval_num_tasks, meta_eval_num_steps, meta_eval_seed) \
                if meta_eval_every > 0 else None
            state = meta_train_on_ray(make_run, num_steps, num_workers=num_workers, copies=copies,
                                      weights=estimator_weights, make_evaluator=make_eval, eval_every=meta_eval_every,
                                      max_staleness=max_staleness, num_estimates_per_step=num_estimates_per_step,
                                      ray_address=ray_address, **loop_options)
        else:
            state = meta_train_locally(learner, ests, num_steps, weights=estimator_weights, meta_evaluator=evaluator,
                                       eval_every=meta_eval_every, validation=selector,
                                       validation_every=validation_every, **loop_options)
        if eval_num_tasks > 0:
            compare_with_adam(task_family, learned_opt, state.final_theta, output_dir, num_tasks=eval_num_tasks,
                              num_steps=eval_num_steps, adam_lrs=eval_adam_lrs, seed=seed)
    return state

#!/usr/bin/env python
"""Meta-train a learned optimizer from gin configs.

    python scripts/outer_train.py --gin_file scripts/configs/quickstart.gin --output_dir /tmp/run \
        [--gin_param 'train.num_steps = 20' ...]

Writes metrics.jsonl, tb/ (TensorBoard), checkpoints/, theta_final.msgpack, config.gin (the
operative config, written once the run has started or resumed) and, when `train.eval_num_tasks > 0`,
comparison.md (learned optimizer vs Adam on held-out tasks). Re-running the same command with the
same --output_dir resumes from the newest readable checkpoint; changing a binding other than run
length, logging, evaluation or checkpoint options (RESUME_SAFE) makes the resume fail with the
differing bindings named, leaving the directory as it was. A new run (no readable checkpoint, or
`train.resume = False`) never starts over an earlier run's results: it fails listing them, unless
--overwrite (or `train.overwrite = True`) is given, which deletes them (SCRIPT_RESULTS) first.

Many machines (Ray): `--gin_param 'train.num_workers = 8'` meta-trains with 8 Ray worker actors
(`outer_trainers.ray_outer_train`), on the cluster at `--ray_address` (e.g. `auto` after
`ray start --head`) or, without it, on a local Ray instance. Each worker rebuilds the estimators
from this run's gin config (`GinRun`); with more workers than estimators the estimator list is
repeated so that each worker owns at least one. `train.max_staleness` / `train.num_estimates_per_step`
select the asynchronous mode; `train.meta_eval_every` then runs in an evaluation actor. The
files written are the same as in a local run.
"""
from __future__ import annotations

import argparse
import logging
import math
import os
from typing import Any, Callable, Optional, Sequence, Union

import gin
import jax
import optax

import outer_trainers as ot
from outer_trainers.devices import use_all_cpu_cores
from lopt.base import LearnedOptimizer
from lopt.file_io import atomic_write_bytes
# importing gin_registry registers the public API with gin
from outer_trainers.gin_registry import gin_bindings, load_config
from outer_trainers.distributed.cluster import connect_ray
from outer_trainers.runs.reporting import DEFAULT_MAX_CONSECUTIVE_DROPPED
from outer_trainers.learner.run_records import run_metadata
from outer_trainers.runs.run_checkpoints import RUN_RESULTS, RunCheckpoints
from outer_trainers.steps.truncation_schedule import TruncationSchedule
from tasks.base import TaskFamily

# Bindings that may change between a run and its resumption (length, logging, evaluation, saving):
# every other binding must match the checkpoint's.
RESUME_SAFE = ("train.num_steps", "train.max_consecutive_dropped", "train.progress", "train.log_every",
               "train.tensorboard", "train.resume", "train.overwrite", "train.eval_", "train.meta_eval_", "train.checkpoint", "train.keep_",
               "train.permanent_", "train.best_", "train.num_workers", "train.max_staleness",
               "train.num_estimates_per_step")
CONFIG_FILE, COMPARISON_FILE = "config.gin", "comparison.md"
SCRIPT_RESULTS = RUN_RESULTS + (CONFIG_FILE, COMPARISON_FILE)  # what a run of this script leaves in output_dir


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


# the arguments of `train` that describe the run's learner and estimators (what `GinRun` rebuilds on a worker)
RUN_ARGS = ("task_family", "learned_opt", "trunc_sched", "estimators", "outer_opt", "meta_loss_split")


def build_run(*, task_family: TaskFamily, learned_opt: LearnedOptimizer, trunc_sched: TruncationSchedule,
              estimators: Sequence[Callable], outer_opt: optax.GradientTransformation,
              meta_loss_split: Optional[str] = None, copies: int = 1) -> tuple:
    """The GradientLearner and the estimators of a run, from `train`'s arguments.

    Args:
      task_family: the tasks meta-trained on.
      learned_opt: the learned optimizer meta-trained.
      trunc_sched: the inner episodes' truncation schedule.
      estimators: classes or factories taking the truncated step, one gradient estimator each.
      outer_opt: the optax optimizer of theta.
      meta_loss_split: the data split of the meta-loss (None: the normalised train loss).
      copies: how many times the estimator list is repeated (each copy has its own particles).

    Returns:
      (GradientLearner, [estimator, ...]) with `copies * len(estimators)` estimators.
    """
    step = ot.LOptTruncatedStep(task_family, learned_opt, trunc_sched, meta_loss_split=meta_loss_split)
    return ot.GradientLearner(learned_opt, outer_opt), [make(step) for _ in range(copies) for make in estimators]


class GinRun:
    """A picklable run description for Ray workers: `GinRun(config_text, copies)()` -> (learner, estimators).

    In a process where this script's `train` is configured (the driver), it builds from the parsed
    config; in a fresh process (a Ray worker) it first imports this script (registering its
    configurables) and parses `config_text`. Nothing jitted is pickled, only the text.

    Args:
      config_text: the run's gin config (`gin.config_str()`).
      copies: how many times the estimator list is repeated (see `build_run`).
    """

    def __init__(self, config_text: str, copies: int = 1):
        self.config_text, self.copies = config_text, int(copies)

    def bindings(self) -> dict:
        """`train`'s bindings, references resolved (parsing `config_text` first in a fresh process)."""
        try:
            return gin.get_bindings("train")
        except ValueError:  # `train` is not registered: a fresh worker process
            import importlib
            importlib.import_module("outer_train")  # scripts/ is on the workers' sys.path, as on the driver's
            with gin.unlock_config():
                gin.parse_config(self.config_text)
            return gin.get_bindings("train")

    def __call__(self) -> tuple:
        """(GradientLearner, [estimator, ...]) of the run (see `build_run`)."""
        b = self.bindings()
        return build_run(**{k: b[k] for k in RUN_ARGS if k in b}, copies=self.copies)


class GinEvaluator:
    """A picklable factory of the run's MetaEvaluator for an evaluation actor: `GinEvaluator(run, ...)()`.

    Args:
      run: the run's GinRun (its config gives the learned optimizer and the default task family).
      num_tasks: tasks drawn per meta-evaluated family.
      num_steps: inner steps of each meta-evaluation run.
      seed: the seed of the meta-evaluation task draws.
    """

    def __init__(self, run: GinRun, num_tasks: int, num_steps: int, seed: int):
        self.run, self.num_tasks, self.num_steps, self.seed = run, num_tasks, num_steps, seed

    def __call__(self) -> ot.MetaEvaluator:
        """The MetaEvaluator of `train.meta_eval_tasks` (default: the task family)."""
        b = self.run.bindings()
        tasks = b.get("meta_eval_tasks") or [b["task_family"]]
        return ot.MetaEvaluator(b["learned_opt"], list(tasks), num_tasks=self.num_tasks, num_steps=self.num_steps,
                                seed=self.seed)


@gin.configurable
def train(output_dir: str, *, task_family: TaskFamily = gin.REQUIRED, learned_opt: LearnedOptimizer = gin.REQUIRED,
          trunc_sched: TruncationSchedule = gin.REQUIRED, estimators: Sequence[Callable] = gin.REQUIRED,
          estimator_weights: Optional[Sequence[float]] = None, outer_opt: optax.GradientTransformation = gin.REQUIRED,
          num_steps: int = 100, seed: int = 0, meta_loss_split: Optional[str] = None,
          eval_num_tasks: int = 0, eval_num_steps: int = 200,
          eval_adam_lrs: Sequence[float] = (1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1, 1.0),
          progress: Union[bool, str] = True, log_every: int = 1, tensorboard: bool = True, resume: bool = True,
          overwrite: bool = False, max_consecutive_dropped: Optional[int] = DEFAULT_MAX_CONSECUTIVE_DROPPED,
          checkpoint_every_steps: Optional[int] = None, checkpoint_every_seconds: Optional[float] = 600.0,
          keep_checkpoints: int = 3, checkpoints_at: Sequence[int] = (),
          permanent_checkpoint_every: Optional[int] = None,
          best_metric: Optional[str] = "eval/final_loss", best_mode: str = "min", keep_best: int = 1,
          meta_eval_every: int = 0, meta_eval_tasks: Optional[Sequence[Any]] = None, meta_eval_num_tasks: int = 4,
          meta_eval_num_steps: int = 100, meta_eval_seed: int = 12345,
          num_workers: int = 0, max_staleness: int = 0, num_estimates_per_step: Optional[int] = None,
          ray_address: Optional[str] = None,
          config: Optional[dict] = None, config_text: Optional[str] = None) -> ot.OuterTrainState:
    """Meta-trains `learned_opt` on `task_family`, then optionally compares it with Adam.

    Checks the arguments and whether the run may start or resume in `output_dir` (nothing is
    written before), writes `config_text` to config.gin, builds the `LOptTruncatedStep` and the
    estimators, runs `outer_train` (checkpointing and resuming in `output_dir`, meta-evaluating
    every `meta_eval_every` steps) and, when `eval_num_tasks` > 0, prints and writes comparison.md:
    `compare_optimizers` on held-out tasks.

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
      eval_num_tasks: held-out tasks of the final comparison with Adam (0: none).
      eval_num_steps: inner steps of each comparison run.
      eval_adam_lrs: Adam's learning-rate grid in the comparison.
      progress: True or "bar" (tqdm), "log" (plain lines, for log files), False or "none".
      log_every: outer steps between metrics lines.
      tensorboard: also write TensorBoard summaries.
      resume: continue from the newest readable checkpoint in `output_dir`; False starts a new run (refused
        where `output_dir` holds results, unless `overwrite`).
      overwrite: start a new run, first deleting the results (SCRIPT_RESULTS) of any run in `output_dir`.
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
      num_workers: Ray worker actors (0: train in this process); see `outer_trainers.ray_outer_train`.
      max_staleness: with workers: the most updates an applied estimate's theta may lag behind (0 and
        `num_estimates_per_step` None: synchronous mode, equal to the local run).
      num_estimates_per_step: with workers: estimates per update in asynchronous mode (None: all estimators).
      ray_address: with workers: the Ray cluster ("auto", "host:port"; None: a local Ray instance).
      config: the run's config, stored with checkpoints; a resume refuses a different one.
      config_text: written to `output_dir`/config.gin once the start or resume check passed (None: not written).

    Returns:
      the final `OuterTrainState`.
    """
    if eval_num_tasks < 0:
        raise ValueError(f"train.eval_num_tasks must be >= 0 (0: no comparison with Adam), got {eval_num_tasks}")
    if eval_num_tasks > 0 and (eval_num_steps < 1 or not eval_adam_lrs):
        raise ValueError(f"the comparison with Adam (train.eval_num_tasks = {eval_num_tasks}) needs "
                         f"train.eval_num_steps >= 1 and at least one train.eval_adam_lrs, got eval_num_steps="
                         f"{eval_num_steps}, eval_adam_lrs={tuple(eval_adam_lrs)}; set them, or eval_num_tasks = 0")
    if num_workers < 0:
        raise ValueError(f"train.num_workers must be >= 0 (0: no Ray workers), got {num_workers}")
    copies = max(1, math.ceil(num_workers / len(estimators))) if num_workers > 0 and estimators else 1
    learner, ests = build_run(task_family=task_family, learned_opt=learned_opt, trunc_sched=trunc_sched,
                              estimators=estimators, outer_opt=outer_opt, meta_loss_split=meta_loss_split,
                              copies=copies)
    evaluator = None
    if meta_eval_every > 0 and num_workers == 0:
        evaluator = ot.MetaEvaluator(learned_opt, list(meta_eval_tasks or [task_family]),
                                     num_tasks=meta_eval_num_tasks, num_steps=meta_eval_num_steps, seed=meta_eval_seed)
    policy = ot.CheckpointPolicy(every_steps=checkpoint_every_steps, every_seconds=checkpoint_every_seconds,
                                 keep=keep_checkpoints, checkpoints_at=tuple(checkpoints_at),
                                 permanent_every=permanent_checkpoint_every,
                                 best_metric=best_metric if meta_eval_every > 0 else None,
                                 best_mode=best_mode, keep_best=keep_best)
    run = RunCheckpoints(output_dir, policy, run_metadata(learner, ests, config), results=SCRIPT_RESULTS)
    starts_new = run.check_start(resume=resume, overwrite=overwrite) is None
    ray_started = num_workers > 0 and connect_ray(ray_address)  # a bad address fails here, before any write
    try:
        if starts_new and overwrite:
            run.clear_results()  # config.gin and comparison.md too; outer_train then starts a new run
        if config_text is not None:
            atomic_write_bytes(os.path.join(output_dir, CONFIG_FILE), config_text.encode("utf-8"))
        if num_workers > 0:
            run_text = config_text if config_text is not None else gin.config_str()
            make_run = GinRun(run_text, copies)
            make_eval = GinEvaluator(make_run, meta_eval_num_tasks, meta_eval_num_steps, meta_eval_seed) \
                if meta_eval_every > 0 else None
            weights = list(estimator_weights) * copies if estimator_weights is not None else None
            state = ot.ray_outer_train(
                make_run, num_steps, num_workers=num_workers, max_staleness=max_staleness,
                num_estimates_per_step=num_estimates_per_step, output_dir=output_dir, seed=seed, weights=weights,
                progress=progress, log_every=log_every, checkpoint_policy=policy, resume=resume,
                make_evaluator=make_eval, eval_every_steps=meta_eval_every, tensorboard=tensorboard, config=config,
                max_consecutive_dropped=max_consecutive_dropped, ray_address=ray_address)
        else:
            state = ot.outer_train(learner, ests, num_steps, output_dir=output_dir, seed=seed,
                                   weights=estimator_weights,
                                   progress=progress, log_every=log_every, checkpoint_policy=policy, resume=resume,
                                   meta_evaluator=evaluator, eval_every=meta_eval_every, tensorboard=tensorboard,
                                   config=config, max_consecutive_dropped=max_consecutive_dropped)
        if eval_num_tasks > 0:
            results = ot.compare_optimizers(
                task_family, lambda th: learned_opt.opt_fn(th, num_steps=eval_num_steps), state.theta,
                num_tasks=eval_num_tasks, num_steps=eval_num_steps, key=jax.random.key(seed + 10_000),
                adam_lrs=tuple(eval_adam_lrs))
            table = ot.format_comparison(results, eval_num_steps)
            title = f"Held-out {task_family.name} tasks ({eval_num_tasks} tasks, same inner steps)"
            print(f"\n{title}\n{table}")
            atomic_write_bytes(os.path.join(output_dir, COMPARISON_FILE),
                               f"# {title}\n\n{table}\n".encode("utf-8"))
        return state
    finally:
        if ray_started:
            import ray
            ray.shutdown()


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """Parses the command line (`argv`, default `sys.argv[1:]`); see `--help`."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gin_file", action="append", default=[], help="gin config file (repeatable)")
    p.add_argument("--gin_param", action="append", default=[], help="gin binding, e.g. 'train.num_steps = 10'")
    p.add_argument("--output_dir", required=True, help="where metrics, theta and reports go")
    p.add_argument("--overwrite", action="store_true",
                   help="start a new run even where output_dir holds one, deleting its results first")
    p.add_argument("--ray_address", default=None,
                   help="meta-train on this Ray cluster ('auto', or the head node's host:port) with "
                        "train.num_workers workers (default 1 with an address; without one, num_workers > 0 "
                        "starts a local Ray instance)")
    return p.parse_args(argv)


def _bound_workers() -> int:
    """`train.num_workers` as bound in the parsed config (0 when unbound)."""
    try:
        return int(gin.query_parameter("train.num_workers"))
    except ValueError:
        return 0


def main(argv: Optional[Sequence[str]] = None) -> ot.OuterTrainState:
    """Parses the command line (`argv`, default `sys.argv[1:]`) and its gin config and runs `train`, which
    saves the config to `output_dir`/config.gin once the run may start or resume.

    Returns:
      `train`'s final state.
    """
    args = parse_args(argv)
    load_config(args.gin_file, args.gin_param)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config_str = gin.config_str()
    options = {"overwrite": True} if args.overwrite else {}  # else train.overwrite's binding (default False)
    if args.ray_address is not None:
        options["ray_address"] = args.ray_address
        if _bound_workers() < 1:
            options["num_workers"] = 1  # an address asks for workers; train.num_workers says how many
    config = {"gin_bindings": gin_bindings(config_str, ignore=RESUME_SAFE)}
    return train(args.output_dir, config=config, config_text=config_str, **options)


if __name__ == "__main__":
    use_all_cpu_cores()  # one XLA CPU device per core (unless XLA_FLAGS / JAX_NUM_CPU_DEVICES chose), before jax starts
    main()

"""ray_outer_train: meta-training with one learner (this process) and Ray worker actors.

    state = ray_outer_train(make_run, num_steps=1000, num_workers=8, output_dir="runs/dist",
                            workers=RayWorkers(max_staleness=1))   # settings beyond the loop's own

`make_run() -> (GradientLearner, [GradientEstimator, ...])` is the run's description; it must be
picklable (a module-level function or `functools.partial` of one, or scripts/outer_train.py's
gin-config factory): each worker calls it to build its own estimators. The learner (the calling
process) owns theta, the outer optimizer state, the step, checkpoints and summaries, and applies
updates with `GradientLearner.update`, reporting with `Reporter` and saving with `RunCheckpoints`
exactly as `outer_train` does (same files, resume and extension rules, progress display, divergence
stop). Worker w owns the estimators i with i % num_workers == w (`assign_estimators`). A learner
that averages theta (`GradientLearner(theta_ema=...)`) carries the average in its state and
checkpoints as `outer_train`'s does: theta_final.msgpack holds the average and theta_last.msgpack
the last theta; meta-evaluation and validation see the average. A learner with `theta_init` starts
there: the learner's process builds it (reads the file) and the workers get theta from it; a
`make_run` with a `worker_estimators()` method lets the workers build only their estimators
(`learner.gin_run.GinRun` does, so no worker reads theta_init).

Synchronous mode (`RayWorkers.max_staleness=0`, `num_estimates_per_step=None`): every outer step sends the
current theta and, per estimator, the key `outer_train` would give it (the step's
`split(state.key, K + 1)`), waits for all workers and applies one update from the K estimates in
estimator order — with the same seed the same theta as `outer_train` over the same estimators, to
float32 tolerance (only the process that runs each XLA program differs).

Asynchronous mode (otherwise): workers never wait for each other; a worker that returns is at
once given the newest theta. The learner applies an update as soon as it holds
`num_estimates_per_step` estimates whose theta version is at most `max_staleness` updates old;
staler ones are dropped and counted. Per step it logs "staleness/mean" and "staleness/max" of the
applied estimates and, cumulative over the session, "staleness/count_<s>" (estimates applied s
versions old, and "staleness/count_gt<max_staleness>" those dropped as staler), "stale_dropped_total",
"lost_estimates_total" and "worker_restarts_total". In synchronous mode it also logs
"timing/round_s" (the step's wall time from sending theta to holding every estimate) and
"timing/worker_s" (the slowest worker's time inside its estimate calls): their difference is the
distributed path's overhead (transfers, scheduling).

Faults: a worker whose process or node dies loses its in-flight estimate; Ray restarts the actor
(elsewhere if its node is gone) and the learner re-initialises its particles at the current
theta, while the other workers go on (in synchronous mode, steps meanwhile use the estimates
that arrived). Re-initialised PES particles restart their perturbation sums and inner
episodes: their first estimates are those of fresh particles (unbiased, but with the short-
horizon weighting of new episodes until they have run a while). The learner checkpoints
theta, the outer optimizer state, the moving average of theta, the key and the step (not the
particles): a killed learner rerun with the same `output_dir` resumes there and the workers start
fresh particles.

Meta-evaluation and validation run in an evaluation actor, as `evaluation=EvalActor(...)` says.
Validation selection (theta_best, as `outer_train(validation=..., validation_every=N)`):
`EvalActor.make_validation()` builds the run's `ValidationSelector` in the learner (for the record and its
cache key) and in the evaluation actor, which scores the result theta of every N-th step, none
skipped (`distributed.eval_worker`). The learner keeps theta_best.msgpack / theta_best.json with
`learner.theta_best.ThetaBest` exactly as `outer_train` does, re-reading the best so far on
resume, and owns the baseline's cache file (validation_baseline.json): it hands the actor the
cached baseline and writes the one the actor tuned. In synchronous mode the validated steps,
thetas and so theta_best equal a local run's.

`RayWorkers` is also the Ray path of the gin-configured run: `learner.gin_run.train(...,
num_workers=8, workers=RayWorkers())` connects with `workers.connection()` before its first write
and meta-trains with `workers.meta_train(...)`. The learner package never imports this module:
scripts/outer_train.py (or a gin file, `train.workers = @RayWorkers()`) hands it in, so the
dependency points from distributed/ to learner/. The loop itself: `distributed.learner_loop`.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, ContextManager, Optional, Sequence, Union

import jax

from outer_trainers.distributed.cluster import connect_ray, import_ray, ray_connection, worker_runtime_env
from outer_trainers.distributed.eval_worker import EvalActor, EvalClient
from outer_trainers.distributed.learner_loop import LearnerLoop
from outer_trainers.distributed.learner_state import init_learner_state
from outer_trainers.distributed.worker_pool import WorkerPool, assign_estimators
from outer_trainers.estimators.estimator_schedule import EstimatorSchedule
from outer_trainers.learner.outer_train import OuterTrainState, save_final_theta
from outer_trainers.learner.run_records import run_metadata
from outer_trainers.learner.theta_best import ThetaBest
from outer_trainers.learner.validation_selection import VALIDATION_CACHE
from outer_trainers.runs.checkpoint_policy import CheckpointPolicy
from outer_trainers.runs.reporting import DEFAULT_MAX_CONSECUTIVE_DROPPED, Reporter
from outer_trainers.runs.run_checkpoints import RunCheckpoints
from outer_trainers.validation import check_int, check_optional_int, check_weights

DEFAULT_STALL_TIMEOUT_S = 900.0


@dataclasses.dataclass(frozen=True)
class RayWorkers:
    """How a run's Ray worker actors run: the settings of `ray_outer_train` beyond the loop's own.

    Attributes:
        max_staleness: the most updates an estimate's theta may lag behind the current theta to be applied.
        num_estimates_per_step: estimates per update in asynchronous mode (None: the number of estimators);
            None with `max_staleness=0` is the synchronous mode, equal to the local loop.
        address: the Ray cluster ("auto", "host:port", "ray://host:port"; see `connect_ray`); None: this
            process's Ray if it is already initialised, else a local instance started for the run.
        num_cpus: CPUs of a local Ray instance started for the run (None: all).
        worker_threads: XLA/OpenMP threads per actor (None: the libraries' defaults); see `worker_runtime_env`.
        max_restarts: how often Ray may restart each worker actor (-1: without limit).
        stall_timeout_s: give up (RuntimeError) when no worker answers for this long.
        actor_options: per worker, extra Ray actor options (e.g. `resources` or a `scheduling_strategy`);
            left out of the hash.
    """
    max_staleness: int = 0
    num_estimates_per_step: Optional[int] = None
    address: Optional[str] = None
    num_cpus: Optional[int] = None
    worker_threads: Optional[int] = 1
    max_restarts: int = -1
    stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S
    actor_options: Optional[Sequence[Optional[dict]]] = dataclasses.field(default=None, hash=False)

    def __post_init__(self):
        if self.actor_options is not None:
            object.__setattr__(self, "actor_options", tuple(self.actor_options))
        check_int("RayWorkers.max_staleness", self.max_staleness, minimum=0)
        check_optional_int("RayWorkers.num_estimates_per_step", self.num_estimates_per_step, minimum=1)
        if not self.stall_timeout_s > 0:
            raise ValueError(f"RayWorkers.stall_timeout_s must be > 0 seconds, got {self.stall_timeout_s}")

    @property
    def synchronous(self) -> bool:
        """Whether every step waits for all estimators (`max_staleness=0`, `num_estimates_per_step=None`)."""
        return self.max_staleness == 0 and self.num_estimates_per_step is None

    def connection(self) -> ContextManager[bool]:
        """`ray_connection(address)` for a `with` block: a bad address fails here, before a run writes anything."""
        return ray_connection(self.address, num_cpus=self.num_cpus)

    def meta_train(self, make_run: Callable[[], tuple], num_steps: int, *, num_workers: int, copies: int = 1,
                   weights: Optional[Sequence[float]] = None, make_evaluator: Optional[Callable[[], Any]] = None,
                   eval_every: int = 0, make_validation: Optional[Callable[[], Any]] = None,
                   validation_every: int = 0, **loop_options: Any) -> OuterTrainState:
        """Meta-trains a run with `num_workers` worker actors: `ray_outer_train` with these settings.

        Args:
            make_run: a picklable factory of (GradientLearner, estimators) that workers call (e.g. a
                `learner.gin_run.GinRun`); its estimators are the run's list repeated `copies` times.
            num_steps: outer steps.
            num_workers: worker actors (>= 1).
            copies: how many times `make_run` repeats the estimator list.
            weights: the weights of one copy of the estimator list (None: equal); repeated `copies` times.
            make_evaluator: a picklable factory of the meta-evaluation, run in an evaluation actor (None: none).
            eval_every: outer steps between meta-evaluations (0: none).
            make_validation: a picklable factory of the run's ValidationSelector (None: no validation).
            validation_every: outer steps between validations (0: none).
            **loop_options: the other options of `ray_outer_train` (output_dir, seed, progress, log_every,
                checkpoint_policy, resume, overwrite, extend, tensorboard, config, max_consecutive_dropped, ...).

        Returns:
            the learner's final OuterTrainState.
        """
        weights = list(weights) * copies if weights is not None else None
        evaluation = EvalActor(make_evaluator, every_steps=eval_every, make_validation=make_validation,
                               validation_every=validation_every)
        return ray_outer_train(make_run, num_steps, num_workers=num_workers, workers=self, weights=weights,
                               evaluation=evaluation, **loop_options)


def ray_outer_train(make_run: Callable[[], tuple], num_steps: int, *, num_workers: int = 2,
                    workers: Any = None, output_dir: Optional[str] = None, seed: int = 0,
                    weights: Optional[Sequence[float]] = None, progress: Union[bool, str] = "auto", log_every: int = 1,
                    callback: Optional[Callable[[int, OuterTrainState, dict], None]] = None,
                    checkpoint_policy: Optional[CheckpointPolicy] = None, resume: bool = True,
                    overwrite: bool = False, evaluation: Any = None,
                    tensorboard: bool = True, config: Optional[dict] = None,
                    max_consecutive_dropped: Optional[int] = DEFAULT_MAX_CONSECUTIVE_DROPPED,
                    extend: bool = False) -> OuterTrainState:
    """Meta-trains theta with Ray worker actors and returns the learner's final state (see the module docstring).

    Args:
        make_run: picklable `make_run() -> (GradientLearner, [GradientEstimator, ...])`, called here and on every worker.
        num_steps: outer steps in total (a resumed run trains up to it; see `outer_train` on extending).
        num_workers: N worker actors (1 <= N <= the number of estimators).
        workers: how the workers run (`RayWorkers`: the asynchronous mode's staleness and estimates per step,
            the cluster's address, threads, restarts, the stall timeout; None: `RayWorkers()`, synchronous
            mode on a local Ray instance or this process's).
        output_dir: where metrics.jsonl, tb/, checkpoints/ and theta_final.msgpack go (None: nowhere).
        seed: the run's seed (for a new run).
        weights: one weight per estimator for the learner's average (default: equal).
        progress: "auto" (a tqdm bar on a terminal, else a plain line every few seconds), "bar", "log" (plain
            lines), "none"; True or False (see `runs.reporting.Reporter`).
        log_every: log metrics every this many steps (and at the last step).
        callback: `callback(step, state, metrics)` after each logged step (as in `outer_train`).
        checkpoint_policy: when to checkpoint (default `CheckpointPolicy()`); needs `output_dir`.
        resume: continue from `output_dir`'s newest readable checkpoint (see `outer_train`).
        overwrite: start a new run over `output_dir`'s results, deleting them first (see `outer_train`).
        evaluation: what the evaluation actor runs (a `distributed.EvalActor`; None: no actor): meta-evaluation of the
            result theta, its metrics logged with the step after they arrive and feeding "best" checkpoints
            (`checkpoint_policy.best_metric`) of the evaluated step's state, and validation selection of
            theta_best (the module docstring).
        tensorboard: also write TensorBoard event files.
        config: JSON-able run configuration stored in checkpoints; it must match on resume.
        max_consecutive_dropped: stop with MetaTrainingDiverged after this many steps in a row that applied
            nothing (see `outer_train`); None: never.
        extend: train the run in `output_dir` further, to another `num_steps` (as `outer_train`'s `extend`).

    Returns:
        The learner's OuterTrainState after the last step (`estimator_states=()`: the particles live on the
        workers).

    Raises:
        ValueError, TypeError: a bad argument (before Ray starts or anything is written).
        ConnectionError: `workers.address` cannot be reached (a `distributed.RayConnectionError`).
        MetaTrainingDiverged: as in `outer_train`.
        RuntimeError: no worker answered for `workers.stall_timeout_s`.
    """
    check_int("num_steps", num_steps, minimum=0)
    check_int("num_workers", num_workers, minimum=1)
    workers = RayWorkers() if workers is None else workers
    if not isinstance(workers, RayWorkers):
        raise TypeError(f"workers must be a RayWorkers, got {type(workers).__name__}")
    check_int("log_every", log_every, minimum=1)
    check_optional_int("max_consecutive_dropped", max_consecutive_dropped, minimum=1)
    evaluation = EvalActor() if evaluation is None else evaluation
    if not isinstance(evaluation, EvalActor):
        raise TypeError(f"evaluation must be an EvalActor, got {type(evaluation).__name__}")
    learner, estimators = make_run()
    if isinstance(estimators, EstimatorSchedule):
        raise TypeError("ray_outer_train takes a list of estimators, not an EstimatorSchedule: its workers own "
                        "their estimators for the whole run; use outer_train for a schedule of estimators")
    estimators = list(estimators)
    if not estimators:
        raise ValueError("ray_outer_train needs at least one GradientEstimator (make_run returned none)")
    K = len(estimators)
    weights = check_weights(weights, K)  # [1.0] * K for None
    assignment = assign_estimators(K, num_workers)
    per_step = K if workers.num_estimates_per_step is None else workers.num_estimates_per_step
    policy = checkpoint_policy or CheckpointPolicy()
    if evaluation.make_evaluator is None and policy.best_metric and (evaluation.every_steps or
                                                                     evaluation.every_seconds):
        raise ValueError("EvalActor.every_steps / every_seconds need make_evaluator")

    run = RunCheckpoints(output_dir, policy, dict(run_metadata(learner, estimators, config), num_steps=num_steps),
                         fixed_length=False)
    run.check_start(resume=resume, overwrite=overwrite, extend=extend)  # refuse before Ray starts or a write
    selector = best = cache = None
    if evaluation.validates:  # a record of other validation settings is refused here too
        selector = _learner_selector(evaluation.make_validation, learner)
        best = ThetaBest(output_dir, learner.learned_opt, selector, read_record=not overwrite)
        cache = selector.cache_path or (os.path.join(output_dir, VALIDATION_CACHE) if output_dir else None)
    started = connect_ray(workers.address, num_cpus=workers.num_cpus)
    ray = import_ray()
    pool = evals = None
    try:
        state, totals = run.restore_or_init(lambda k: init_learner_state(learner, K, k), jax.random.key(seed),
                                            resume=resume, overwrite=overwrite, extend=extend)
        env = worker_runtime_env(workers.worker_threads)
        pool = WorkerPool(make_run, assignment, actor_options=workers.actor_options, runtime_env=env,
                          max_restarts=workers.max_restarts)
        if evaluation.evaluates or evaluation.validates:
            baselines = selector.read_cache(cache) if cache is not None and os.path.exists(cache) else None
            evals = EvalClient(evaluation.make_evaluator if evaluation.evaluates else None,
                               every_steps=evaluation.every_steps, every_seconds=evaluation.every_seconds,
                               make_validation=evaluation.make_validation,
                               validation_every=evaluation.validation_every, baselines=baselines, runtime_env=env)
        loop = LearnerLoop(learner, estimators, weights, state, seed, pool, evals, run, workers.max_staleness,
                           per_step, workers.synchronous, workers.stall_timeout_s, ray, theta_best=best,
                           baseline_cache=cache)
        target = num_steps
        with Reporter(output_dir, start=state.step, target=target, progress=progress, log_every=log_every,
                      tensorboard=tensorboard, totals=totals,
                      max_consecutive_dropped=max_consecutive_dropped) as reporter:
            state = loop.run(target, reporter, callback)
        if output_dir is not None:
            save_final_theta(output_dir, learner, state)
        return state
    finally:
        if pool is not None:
            pool.shutdown()
        if evals is not None:
            evals.shutdown()
        if started:
            ray.shutdown()


def _learner_selector(make_validation: Callable[[], Any], learner: Any) -> Any:
    """The run's ValidationSelector in the learner's process, checked against the learner's learned optimizer."""
    selector = make_validation()
    lo, mine = getattr(selector, "learned_opt", None), learner.learned_opt
    if type(lo) is not type(mine) or lo.config() != mine.config():
        raise ValueError(f"make_validation builds a selector of {type(lo).__name__}, but the learner meta-trains a "
                         f"{type(mine).__name__} {mine.config()}; build it with the run's learned optimizer")
    return selector

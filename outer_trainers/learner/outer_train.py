"""outer_train: the meta-training loop.

    restore or init ─► for each outer step: (re)sample estimators if scheduled ─► outer_step ─► report ─► checkpoint

Each outer step asks every estimator for an estimate at the current theta and lets the learner
combine them and update theta (dropping non-finite estimates and those without a valid inner
step); the Reporter (outer_trainers.runs.reporting) logs it and RunCheckpoints
(outer_trainers.runs.run_checkpoints) saves what the policy asks for. After `reporting.max_consecutive_dropped`
steps in a row that applied nothing, the run stops with `reporting.MetaTrainingDiverged`.
With `output_dir`:

    metrics.jsonl        one JSON object per logged step (the same scalars as TensorBoard)
    tb/                  TensorBoard event files (tensorboardX)
    checkpoints/         full OuterTrainState checkpoints (see outer_trainers.runs.checkpoint_manager)
    theta_final.msgpack  the final theta (load it with `lopt.load_theta`): `OuterTrainState.final_theta`,
                         the moving average of theta when the learner keeps one (`GradientLearner(theta_ema=...)`)
    theta_last.msgpack   with averaging only: the last theta itself
    theta_best.msgpack   with `validation`: the best-scoring theta on the validation tasks so far, and
    theta_best.json      its record (step, metrics, validation settings, baseline cache key; see
                         `learner.validation_selection`); validation_baseline.json caches the tuned baseline

Re-running with the same `output_dir` resumes from the newest readable checkpoint and trains
until `num_steps` outer steps in total; the result is bit-identical to an uninterrupted run.
Passing `state=` instead continues that state for `num_steps` more steps.

Training further: the checkpoints record the run's length, and a resume with a larger
`num_steps` trains a finished or interrupted run further, as it always has, recording the
extension (from, to, at which step, when) in the run's config history (`runs.run_extension`,
`runs.run_checkpoints.config_history`). `extend=True` says so explicitly: then a `num_steps` below
the steps already taken is refused (without it: a warning, and nothing is trained), and the
horizon bindings of a gin `config` (an outer schedule's `decay_steps`, ...) may change too. What
continues, and how:

- the OuterTrainState (theta, the outer optimizer's state, every particle's inner state and
  truncation, the key, the step) as the checkpoint holds it. Nothing of the loop depends on
  num_steps: truncation schedules, an EstimatorSchedule's periods, meta-evaluation and
  checkpoint steps count outer iterations. With an outer optimizer without a horizon (a constant
  learning rate) the extended run is bit-identical to a run started with the new `num_steps`;
- the outer optimizer is the `learner` given now. Its optax state keeps a step count but no
  horizon, so a learning-rate schedule over the run's length (e.g. `optax.cosine_decay_schedule`
  with `decay_steps` = num_steps) follows whatever horizon the transform is built with: rebuilt
  for the new length, the steps after the checkpoint take the new schedule's values at their
  step (a schedule that had decayed to its end steps back up to the new one's value there); left
  as it was, the schedule stays at its end value;
- the learned optimizer's own horizon (`opt_fn(theta, num_steps=...)`) is that of the inner
  problems (the truncation schedule), not the outer length: extension does not change it.
"""
from __future__ import annotations

import functools
import os
import warnings
from typing import Any, Callable, Optional, Sequence, Union

import jax
import jax.numpy as jnp
from flax import struct

from lopt.serialization import save_theta
from outer_trainers.runs.checkpoint_policy import CheckpointPolicy
from outer_trainers.estimators.estimator_schedule import EstimatorSchedule
from outer_trainers.estimators.gradient_estimator import GradientEstimator
from outer_trainers.validation import check_int, check_optional_int, check_weights
from outer_trainers.learner.gradient_learner import GradientLearner, LearnerState
from outer_trainers.runs.reporting import Reporter, RunTotals
from outer_trainers.learner.run_records import estimator_labels, run_metadata
from outer_trainers.learner.run_settings import Reporting
from outer_trainers.learner.theta_best import ThetaBest
from outer_trainers.learner.validation_selection import VALIDATION_CACHE, ValidationSelector
from outer_trainers.runs.run_checkpoints import THETA_FINAL, THETA_LAST, RunCheckpoints


@struct.dataclass
class OuterTrainState:
    """Everything an outer-training run carries from one outer step to the next (what a checkpoint holds).

    Attributes:
        learner_state: the GradientLearner's LearnerState (theta, outer optimizer state, updates applied).
        estimator_states: one state per estimator (their particles), in the estimators' order.
        key: the PRNG key the next outer step splits.
        iteration: int32 []: outer steps taken, including steps whose update was dropped as non-finite.
    """
    learner_state: LearnerState
    estimator_states: tuple
    key: jax.Array
    iteration: jax.Array

    @property
    def theta(self) -> Any:
        """The current theta (`learner_state.theta`)."""
        return self.learner_state.theta

    @property
    def final_theta(self) -> Any:
        """The run's result: the moving average of theta when the learner keeps one (`theta_ema`), else theta.

        It is what theta_final.msgpack holds and what meta-evaluation evaluates.
        """
        avg = self.learner_state.theta_avg
        return self.learner_state.theta if avg is None else avg

    @property
    def step(self) -> int:
        """Outer steps taken (including steps whose update was dropped as non-finite), as a Python int."""
        return int(self.iteration)


def init_outer_state(learner: GradientLearner, estimators: Sequence[GradientEstimator],
                     key: jax.Array) -> OuterTrainState:
    """The state of a run before its first outer step.

    Args:
        learner: the GradientLearner (draws theta and the outer optimizer state).
        estimators: the estimators of step 0 (each initialises its particles at the initial theta).
        key: the run's PRNG key.

    Returns:
        An OuterTrainState at iteration 0.
    """
    k_learner, k_est, key = jax.random.split(key, 3)
    learner_state = learner.init(k_learner)
    est_keys = jax.random.split(k_est, len(estimators))
    est_states = tuple(e.init_state(learner_state.theta, k, outer_state=0) for e, k in zip(estimators, est_keys))
    return OuterTrainState(learner_state, est_states, key, jnp.zeros((), jnp.int32))


def outer_step(learner: GradientLearner, estimators: Sequence[GradientEstimator], state: OuterTrainState,
               outer_iteration: int, weights: Optional[Sequence[float]] = None) -> tuple[OuterTrainState, dict]:
    """One outer iteration: an estimate from each estimator at the current theta, then one learner update.

    Args:
        learner: the GradientLearner.
        estimators: the estimators whose states `state.estimator_states` holds.
        state: the run's state before the step.
        outer_iteration: the step's index (outer steps taken before it), passed to the estimators as `outer_state`.
        weights: one weight per estimator for the learner's average (default: equal).

    Returns:
        (state after the step, the learner's metrics; see `GradientLearner.update`).
    """
    key, *keys = jax.random.split(state.key, len(estimators) + 1)
    theta = state.learner_state.theta
    new_est_states, estimates = [], []
    for est, est_state, k in zip(estimators, state.estimator_states, keys):
        est_state, estimate = est.estimate(theta, est_state, k, outer_state=outer_iteration)
        new_est_states.append(est_state)
        estimates.append(estimate)
    learner_state, metrics = learner.update(state.learner_state, estimates, weights)
    next_iteration = jnp.asarray(outer_iteration + 1, jnp.int32)
    return OuterTrainState(learner_state, tuple(new_est_states), key, next_iteration), metrics


def resample_estimators(schedule: EstimatorSchedule, state: OuterTrainState,
                        outer_iteration: int) -> tuple[list, OuterTrainState]:
    """The schedule's estimators for `outer_iteration`, with fresh states at the current theta.

    Args:
        schedule: the run's EstimatorSchedule.
        state: the run's state before step `outer_iteration`.
        outer_iteration: the step that starts a new period.

    Returns:
        (estimators, state with their states): the keys are derived from `state.key` and
        `outer_iteration`; `state.key` itself is left as it is.
    """
    estimators = schedule(outer_iteration)
    keys = jax.random.split(jax.random.fold_in(state.key, outer_iteration), len(estimators))
    est_states = tuple(e.init_state(state.theta, k, outer_state=outer_iteration) for e, k in zip(estimators, keys))
    return estimators, state.replace(estimator_states=est_states)


def _check_arguments(num_steps: int, reporting: Reporting, policy: Optional[CheckpointPolicy],
                     meta_evaluator: Optional[Callable], eval_every: int, weights: Optional[Sequence[float]],
                     num_estimators: Optional[int], learner: GradientLearner, validation: Optional[ValidationSelector],
                     validation_every: int) -> None:
    """Refuses bad arguments before anything is restored, written or run."""
    check_int("num_steps", num_steps, minimum=0)
    if not isinstance(reporting, Reporting):
        raise TypeError(f"reporting must be an outer_trainers.Reporting (e.g. Reporting(progress=False)), got "
                        f"{type(reporting).__name__}")
    check_int("log_every", reporting.log_every, minimum=1)
    check_int("eval_every", eval_every, minimum=0)
    check_int("validation_every", validation_every, minimum=0)
    check_optional_int("max_consecutive_dropped", reporting.max_consecutive_dropped, minimum=1)
    check_weights(weights, num_estimators)  # an EstimatorSchedule's count (None) is checked at each update
    if validation_every and validation is None:
        raise ValueError(f"validation_every={validation_every} needs a validation selector: pass "
                         f"validation=ValidationSelector(learned_opt, suite or tasks, ...), or validation_every=0")
    if validation is not None:
        if not isinstance(validation, ValidationSelector):
            raise TypeError(f"validation must be a ValidationSelector, got {type(validation).__name__}")
        if not validation_every:
            raise ValueError("validation was given but validation_every=0, so it would never run; pass "
                             "validation_every >= 1 (outer steps between validations), or validation=None")
        lo, mine = validation.learned_opt, learner.learned_opt
        if type(lo) is not type(mine) or lo.config() != mine.config():
            raise ValueError(f"validation scores a {type(lo).__name__} {lo.config()}, but the learner meta-trains a "
                             f"{type(mine).__name__} {mine.config()}; build the ValidationSelector with the "
                             f"learner's learned optimizer")
    if policy is not None and policy.best_metric and not (meta_evaluator and eval_every) and validation is None:
        warnings.warn(f"best_metric={policy.best_metric!r} needs meta_evaluator and eval_every > 0 (or validation "
                      f"and validation_every > 0 for a 'valid/' metric); no best checkpoints will be written")


def _restore_or_init(run: RunCheckpoints, learner: GradientLearner,
                     estimators_of_state: Callable[[int], Sequence[GradientEstimator]], seed: int,
                     resume: bool, overwrite: bool, extend: bool) -> tuple[OuterTrainState, RunTotals]:
    """The newest checkpoint's state (built for the estimators that wrote it), or a new run's state."""
    key = jax.random.key(seed)
    init_at = lambda steps: functools.partial(init_outer_state, learner, estimators_of_state(steps))
    return run.restore_or_init(init_at(0), key, resume=resume, overwrite=overwrite, extend=extend,
                               structure_at=lambda steps: jax.eval_shape(init_at(steps), key))


def outer_train(learner: GradientLearner, estimators: Union[Sequence[GradientEstimator], EstimatorSchedule],
                num_steps: int, *,
                output_dir: Optional[str] = None, seed: int = 0, weights: Optional[Sequence[float]] = None,
                state: Optional[OuterTrainState] = None, reporting: Reporting = Reporting(),
                callback: Optional[Callable[[int, OuterTrainState, dict], None]] = None,
                checkpoint_policy: Optional[CheckpointPolicy] = None, resume: bool = True, overwrite: bool = False,
                meta_evaluator: Optional[Callable[[Any], dict]] = None, eval_every: int = 0,
                config: Optional[dict] = None, extend: bool = False, validation: Optional[ValidationSelector] = None,
                validation_every: int = 0) -> OuterTrainState:
    """Meta-trains theta and returns the final OuterTrainState (`.theta`).

    Args:
        learner: the GradientLearner (learned optimizer and outer optimizer).
        estimators: the GradientEstimators every outer step asks for an estimate, or an EstimatorSchedule
            (new estimators, with fresh states at the current theta, every `every` steps).
        num_steps: without `state`: outer steps in total (a resumed run trains up to it, recording a change of
            length in its config history); with `state`: more steps.
        output_dir: where metrics.jsonl, tb/, checkpoints/ and theta_final.msgpack go (None: nowhere).
        seed: the run's seed (for a new run).
        weights: one weight per estimator for the learner's average (default: equal).
        state: an OuterTrainState to continue instead of restoring or initialising.
        reporting: what the run shows and logs, and when it gives up on a diverged run (`Reporting`:
            progress, log_every, tensorboard, max_consecutive_dropped), e.g.
            `Reporting(progress=False, tensorboard=False)` in a notebook or a test.
        callback: `callback(step, state, metrics)` after each logged step, after that step's checkpoints
            are written (metrics as Python numbers).
        checkpoint_policy: when to checkpoint (default `CheckpointPolicy()`); needs `output_dir`.
        resume: with `output_dir`, continue from its newest readable checkpoint (which must match this run);
            when every checkpoint there is unreadable the run refuses to start, naming the files.
        overwrite: with `output_dir`, start a new run even where it holds a previous run's results, deleting
            them (metrics.jsonl, tb/, checkpoints/, the theta files: `runs.run_checkpoints.RUN_RESULTS`) first;
            otherwise a new run there is refused.
        meta_evaluator: `meta_evaluator(theta) -> {name: float}` (e.g. a MetaEvaluator) of `state.final_theta` (the
            moving average of theta when the learner keeps one); its metrics join
            the step's log and feed "best" checkpoints (`checkpoint_policy.best_metric`).
        eval_every: run `meta_evaluator` every this many steps (0: never).
        config: JSON-able run configuration stored in checkpoints; it must match on resume.
        extend: train the run in `output_dir` further, explicitly: continue its checkpoint (finished or
            interrupted) to `num_steps`, which must be at least the steps it has taken (fewer is refused,
            changing nothing on disk), and let the horizon bindings of a gin `config` change with the length
            (`runs.run_extension`). What continues and how: the module docstring.
        validation: a `ValidationSelector`: every `validation_every` steps it scores `state.final_theta` on its
            validation tasks against its tuned baseline (cached in `output_dir`/validation_baseline.json unless
            it names its own `cache_path`); the "valid/" metrics join the step's log (with "valid/best_score"),
            and a score that beats the best so far writes theta_best.msgpack and theta_best.json (before the
            step's checkpoint). The best so far is re-read from theta_best.json on resume, so it is never
            replaced by a worse theta (see `learner.validation_selection` and `learner.theta_best`).
        validation_every: outer steps between validations (0: none; needs `validation`).

    Returns:
        The OuterTrainState after the last step.

    Raises:
        MetaTrainingDiverged: `reporting.max_consecutive_dropped` steps in a row applied nothing (the count
            survives a resume) (raised after that
            step is logged; checkpoints written before it stay, theta_final.msgpack is not written).
        ValueError, TypeError: a bad argument (before anything is restored, written or run).
    """
    if extend and state is not None:
        raise ValueError("extend=True trains the run in output_dir further; with state= there is nothing to "
                         "resume (num_steps already counts more steps)")
    fixed = None if isinstance(estimators, EstimatorSchedule) else list(estimators)
    _check_arguments(num_steps, reporting, checkpoint_policy, meta_evaluator, eval_every, weights,
                     None if fixed is None else len(fixed), learner, validation, validation_every)
    if fixed is None:
        schedule, estimators_of_state = estimators, estimators.estimators_of_state
        meta = run_metadata(learner, [repr(schedule)], config)
    else:
        schedule = None
        if not fixed:
            raise ValueError("outer_train needs at least one GradientEstimator")
        estimators_of_state = lambda steps: fixed
        meta = run_metadata(learner, fixed, config)
    target = num_steps if state is None else state.step + num_steps
    run = RunCheckpoints(output_dir, checkpoint_policy, dict(meta, num_steps=target), fixed_length=False)

    cache = None if validation is None else validation.cache_path or (
        os.path.join(output_dir, VALIDATION_CACHE) if output_dir is not None else None)
    # the record is read before a resume (an overwritten run's is deleted, so it is not read then)
    best = None if validation is None else ThetaBest(output_dir, learner.learned_opt, validation,
                                                     read_record=not (overwrite and state is None))
    if state is None:
        state, totals = _restore_or_init(run, learner, estimators_of_state, seed, resume, overwrite, extend)
        if state.step > target:  # a checkpoint that records no length (written before runs recorded it)
            warnings.warn(f"the checkpoint in {output_dir} is at step {state.step}, past num_steps={target}")
    else:
        totals = RunTotals()
    start = state.step
    estimators = estimators_of_state(start)
    with Reporter(output_dir, start=start, target=target, meta_evaluator=meta_evaluator, eval_every=eval_every,
                  totals=totals, **reporting.loop_options()) as reporter:
        for i in range(start, target):
            if schedule is not None and schedule.resamples_at(i):
                estimators, state = resample_estimators(schedule, state, i)
            state, metrics = outer_step(learner, estimators, state, i, weights)
            valid = None
            if validation is not None and (i + 1) % validation_every == 0:  # an improvement writes theta_best
                valid = best.record(i + 1, state.final_theta, validation(state.final_theta, cache_path=cache),
                                    averaged=state.learner_state.theta_avg is not None)  # before the checkpoint
            logged = reporter.report(i + 1, metrics, labels=estimator_labels(estimators),
                                     inner_steps=sum(e.inner_steps_per_estimate for e in estimators),
                                     theta=state.final_theta, extra=valid)
            run.save(i + 1, state, reporter.totals(), logged, final=i + 1 == target)
            if logged is not None and callback is not None:
                callback(i + 1, state, logged)
    if output_dir is not None:
        save_final_theta(output_dir, learner, state)
    return state


def save_final_theta(output_dir: str, learner: GradientLearner, state: OuterTrainState) -> None:
    """Writes theta_final.msgpack (`state.final_theta`) and, when the state holds an average, theta_last.msgpack.

    Args:
        output_dir: the run's directory.
        learner: the run's GradientLearner (its learned optimizer is recorded with theta).
        state: the run's final OuterTrainState.
    """
    save_theta(os.path.join(output_dir, THETA_FINAL), learner.learned_opt, state.final_theta)
    if state.learner_state.theta_avg is not None:
        save_theta(os.path.join(output_dir, THETA_LAST), learner.learned_opt, state.theta)

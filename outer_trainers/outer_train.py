"""outer_train: the meta-training loop.

Each outer step asks every estimator for an estimate at the current theta, lets the learner
combine them and update theta (dropping non-finite estimates), and reports. With `output_dir`:

    metrics.jsonl        one JSON object per logged step (the same scalars as TensorBoard)
    tb/                  TensorBoard event files (tensorboardX)
    checkpoints/         full OuterTrainState checkpoints (see outer_trainers.checkpoints)
    theta_final.msgpack  the final theta (load it with `lopt.load_theta`)

Re-running with the same `output_dir` resumes from the latest complete checkpoint and trains
until `num_steps` outer steps in total; the result is bit-identical to an uninterrupted run.
Passing `state=` instead continues that state for `num_steps` more steps.
"""
from __future__ import annotations

import json
import logging
import os
import time
import warnings
from typing import Any, Callable, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from lopt.serialization import save_theta
from outer_trainers.checkpoints import CheckpointManager, CheckpointPolicy
from outer_trainers.estimator_schedule import EstimatorSchedule
from outer_trainers.estimators.gradient_estimator import GradientEstimator
from outer_trainers.gradient_learner import GradientLearner, LearnerState
from outer_trainers.summaries import MetricsLog, Progress

logger = logging.getLogger("outer_trainers")
CHECKPOINT_DIR = "checkpoints"


@struct.dataclass
class OuterTrainState:
    learner_state: LearnerState
    estimator_states: tuple
    key: jax.Array
    iteration: Any = None  # int32 []: outer steps taken (None in states built by older code)

    @property
    def theta(self) -> Any:
        return self.learner_state.theta

    @property
    def step(self) -> int:
        """Outer steps taken (including steps whose update was dropped as non-finite)."""
        return int(self.learner_state.step if self.iteration is None else self.iteration)


def init_outer_state(learner: GradientLearner, estimators: Sequence[GradientEstimator],
                     key: jax.Array) -> OuterTrainState:
    k_learner, k_est, key = jax.random.split(key, 3)
    learner_state = learner.init(k_learner)
    est_keys = jax.random.split(k_est, len(estimators))
    est_states = tuple(e.init_state(learner_state.theta, k, outer_state=0) for e, k in zip(estimators, est_keys))
    return OuterTrainState(learner_state, est_states, key, jnp.zeros((), jnp.int32))


def outer_step(learner: GradientLearner, estimators: Sequence[GradientEstimator], state: OuterTrainState,
               outer_iteration: int, weights: Optional[Sequence[float]] = None) -> tuple[OuterTrainState, dict]:
    """One outer iteration: an estimate from each estimator, then one learner update."""
    key, *keys = jax.random.split(state.key, len(estimators) + 1)
    theta = state.learner_state.theta
    new_est_states, estimates = [], []
    for est, est_state, k in zip(estimators, state.estimator_states, keys):
        est_state, estimate = est.estimate(theta, est_state, k, outer_state=outer_iteration)
        new_est_states.append(est_state)
        estimates.append(estimate)
    learner_state, metrics = learner.update(state.learner_state, estimates, weights)
    return OuterTrainState(learner_state, tuple(new_est_states), key, jnp.asarray(outer_iteration + 1, jnp.int32)), metrics


def estimator_labels(estimators: Sequence[GradientEstimator]) -> list[str]:
    """"<Estimator>/<task family>" per estimator (index-suffixed when two coincide): the names
    under which per-estimator metrics are logged, e.g. "meta_loss/TruncatedPES/quadratic_dim4"."""
    labels = []
    for e in estimators:
        family = getattr(getattr(e, "truncated_step", None), "task_family", None)
        labels.append(type(e).__name__ + (f"/{family.name}" if family is not None else ""))
    return [lab if labels.count(lab) == 1 else f"{lab}_{i}" for i, lab in enumerate(labels)]


def _to_python(metrics: dict, labels: Sequence[str]) -> dict:
    out = {}
    for k, v in jax.device_get(metrics).items():
        v = np.asarray(v)
        head, _, tail = k.rpartition("/")
        if head and tail.isdigit() and int(tail) < len(labels):
            k = f"{head}/{labels[int(tail)]}"
        out[k] = v.item() if v.size == 1 else v.tolist()
    return out


def _resample(schedule: EstimatorSchedule, state: OuterTrainState, outer_iteration: int):
    """The schedule's estimators for `outer_iteration`, with fresh states at the current theta."""
    estimators = schedule(outer_iteration)
    keys = jax.random.split(jax.random.fold_in(state.key, outer_iteration), len(estimators))
    est_states = tuple(e.init_state(state.theta, k, outer_state=outer_iteration) for e, k in zip(estimators, keys))
    return estimators, state.replace(estimator_states=est_states)


def run_metadata(learner: GradientLearner, estimators: Sequence[Union[GradientEstimator, str]],
                 config: Optional[dict] = None) -> dict:
    """What a checkpoint must match to be resumed: the learned optimizer's architecture and config,
    the estimators (or labels such as an EstimatorSchedule's repr), and `config` (e.g. the run's
    gin bindings)."""
    lo = learner.learned_opt
    labels = [e if isinstance(e, str) else getattr(e, "name", type(e).__name__) for e in estimators]
    meta = {"architecture": type(lo).__name__, "lopt_config": json.loads(json.dumps(lo.config(), sort_keys=True)),
            "estimators": labels}
    if config is not None:
        meta["config"] = json.loads(json.dumps(config, sort_keys=True))
    return meta


def outer_train(learner: GradientLearner, estimators: Union[Sequence[GradientEstimator], EstimatorSchedule],
                num_steps: int, *,
                output_dir: Optional[str] = None, seed: int = 0, weights: Optional[Sequence[float]] = None,
                state: Optional[OuterTrainState] = None, progress: Union[bool, str] = True, log_every: int = 1,
                callback: Optional[Callable[[int, OuterTrainState, dict], None]] = None,
                checkpoint_policy: Optional[CheckpointPolicy] = None, resume: bool = True,
                meta_evaluator: Optional[Callable[[Any], dict]] = None, eval_every: int = 0,
                tensorboard: bool = True, config: Optional[dict] = None) -> OuterTrainState:
    """Meta-trains and returns the final OuterTrainState (`.theta`).

    Without `state`: trains (or, with `output_dir` and `resume`, resumes) up to `num_steps` outer
    steps in total; with `state`: `num_steps` more steps. `progress`: True/"bar" (tqdm), "log"
    (plain lines, for log files), False/"none". Every `eval_every` steps, `meta_evaluator(theta)`
    (e.g. a MetaEvaluator) adds its metrics to the step's log and feeds "best" checkpoints
    (`checkpoint_policy.best_metric`). `config` (JSON-able) is stored in checkpoints and must
    match on resume. `callback(step, state, metrics)` runs after each logged step, after that
    step's checkpoints are written (metrics as Python floats). `estimators` may be an
    EstimatorSchedule: new estimators (fresh states at the current theta) every `every` steps.
    """
    schedule = estimators if isinstance(estimators, EstimatorSchedule) else None
    estimators = schedule(0) if schedule is not None else list(estimators)
    if not estimators:
        raise ValueError("outer_train needs at least one GradientEstimator")
    if num_steps < 0:
        raise ValueError(f"num_steps must be >= 0, got {num_steps}")
    if log_every < 1:
        raise ValueError(f"log_every must be >= 1, got {log_every}")
    mode = {True: "bar", False: "none"}.get(progress, progress)
    policy = checkpoint_policy or CheckpointPolicy()
    if policy.best_metric and not (meta_evaluator and eval_every):
        warnings.warn(f"best_metric={policy.best_metric!r} needs meta_evaluator and eval_every > 0; "
                      f"no best checkpoints will be written")
    meta = run_metadata(learner, estimators if schedule is None else [repr(schedule)], config)
    mgr = CheckpointManager(os.path.join(output_dir, CHECKPOINT_DIR), policy) if output_dir is not None else None

    elapsed0, dropped_total = 0.0, 0
    if state is not None:
        target = state.step + num_steps
    else:
        target = num_steps
        init = lambda k: init_outer_state(learner, estimators, k)
        found = None
        if mgr is not None and resume:
            newest = mgr.all()
            if schedule is not None and newest:  # the estimators the newest checkpoint was written with
                estimators = schedule(max(newest[0][0] - 1, 0))
            found = mgr.restore_latest(jax.eval_shape(init, jax.random.key(seed)), expect=meta)
        if found is not None:
            state, payload = found
            elapsed0 = float(payload["meta"].get("elapsed_s", 0.0))
            dropped_total = int(payload["meta"].get("num_dropped_total", 0))
            logger.info("resuming from step %d (%s)", state.step, output_dir)
            if state.step > target:
                warnings.warn(f"the checkpoint in {output_dir} is at step {state.step}, past num_steps={target}")
        else:
            state = init(jax.random.key(seed))
    start = state.step
    if schedule is not None:  # the estimators that wrote `state` (a restored or a caller's one)
        estimators = schedule(max(start - 1, 0))
    inner_per_step = sum(getattr(e, "inner_steps_per_estimate", 0) for e in estimators)
    labels = estimator_labels(estimators)
    log = MetricsLog(output_dir, resume_step=start, tensorboard=tensorboard)
    bar = Progress(mode, total=max(target, start), initial=start)
    t_start = t_last = time.perf_counter()
    if mgr is not None:
        mgr.mark_time(t_start)
    steps_since = 0
    try:
        for i in range(start, target):
            if schedule is not None and schedule.resamples_at(i):
                estimators, state = _resample(schedule, state, i)
                inner_per_step = sum(getattr(e, "inner_steps_per_estimate", 0) for e in estimators)
                labels = estimator_labels(estimators)
            state, metrics = outer_step(learner, estimators, state, i, weights)
            step, steps_since = i + 1, steps_since + 1
            dropped = int(metrics["num_dropped"])
            if dropped:
                dropped_total += dropped
                msg = (f"outer step {step}: {dropped} of {len(estimators)} estimates had a non-finite meta-loss "
                       f"or gradient and were dropped from the update ({dropped_total} so far)")
                logger.warning(msg)
                if dropped_total == dropped:
                    warnings.warn(msg, RuntimeWarning)
            do_eval = meta_evaluator is not None and eval_every > 0 and step % eval_every == 0
            m = None
            if step % log_every == 0 or step == target or do_eval:
                now = time.perf_counter()
                m = _to_python(metrics, labels)
                m["inner_steps_per_s"] = inner_per_step * steps_since / max(now - t_last, 1e-9)
                m["elapsed_s"] = elapsed0 + now - t_start
                m["num_dropped_total"] = dropped_total
                t_last, steps_since = now, 0
                if do_eval:
                    m.update(meta_evaluator(state.theta))
                log.write(step, m)
            now = time.perf_counter()
            if mgr is not None:
                ck_meta = dict(meta, elapsed_s=elapsed0 + now - t_start, num_dropped_total=dropped_total)
                mgr.save(step, state, ck_meta, kinds=mgr.due(step, now, final=step == target), now=now)
                if m is not None and policy.best_metric and policy.best_metric in m:
                    mgr.save_best(step, state, m[policy.best_metric], ck_meta)
            bar.update(1, m)
            if m is not None and callback is not None:
                callback(step, state, m)
    finally:
        bar.close()
        log.close()
    if output_dir is not None:
        save_theta(os.path.join(output_dir, "theta_final.msgpack"), learner.learned_opt, state.theta)
    return state

"""outer_train: the meta-training loop.

Each outer step asks every estimator for an estimate at the current theta, lets the learner
combine them and update theta, and logs: a progress bar (meta-loss, inner steps/s, ETA) and,
with `output_dir`, one JSON object per logged step in `metrics.jsonl` and the final theta in
`theta_final.msgpack` (load it with `lopt.load_theta`).
"""
from __future__ import annotations

import json
import math
import os
import time
from typing import Any, Callable, Optional, Sequence

import jax
import numpy as np
from flax import struct

from lopt.serialization import save_theta
from outer_trainers.gradient_estimator import GradientEstimator
from outer_trainers.gradient_learner import GradientLearner, LearnerState


@struct.dataclass
class OuterTrainState:
    learner_state: LearnerState
    estimator_states: tuple
    key: jax.Array

    @property
    def theta(self) -> Any:
        return self.learner_state.theta

    @property
    def step(self) -> int:
        return int(self.learner_state.step)


def init_outer_state(learner: GradientLearner, estimators: Sequence[GradientEstimator],
                     key: jax.Array) -> OuterTrainState:
    k_learner, k_est, key = jax.random.split(key, 3)
    learner_state = learner.init(k_learner)
    est_keys = jax.random.split(k_est, len(estimators))
    est_states = tuple(e.init_state(learner_state.theta, k, outer_state=0) for e, k in zip(estimators, est_keys))
    return OuterTrainState(learner_state, est_states, key)


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
    return OuterTrainState(learner_state, tuple(new_est_states), key), metrics


def _to_python(metrics: dict) -> dict:
    out = {}
    for k, v in jax.device_get(metrics).items():
        v = np.asarray(v)
        out[k] = v.item() if v.size == 1 else v.tolist()
    return out


def outer_train(learner: GradientLearner, estimators: Sequence[GradientEstimator], num_steps: int, *,
                output_dir: Optional[str] = None, seed: int = 0, weights: Optional[Sequence[float]] = None,
                state: Optional[OuterTrainState] = None, progress: bool = True, log_every: int = 1,
                callback: Optional[Callable[[int, OuterTrainState, dict], None]] = None) -> OuterTrainState:
    """Meta-trains for `num_steps` outer steps and returns the final OuterTrainState (`.theta`).

    `callback(step, state, metrics)` runs after each logged step (metrics as Python floats).
    """
    estimators = list(estimators)
    if not estimators:
        raise ValueError("outer_train needs at least one GradientEstimator")
    if num_steps < 0:
        raise ValueError(f"num_steps must be >= 0, got {num_steps}")
    if state is None:
        state = init_outer_state(learner, estimators, jax.random.key(seed))
    inner_per_step = sum(e.inner_steps_per_estimate for e in estimators)
    log_file = None
    if output_dir is not None:
        os.makedirs(output_dir, exist_ok=True)
        log_file = open(os.path.join(output_dir, "metrics.jsonl"), "a", encoding="utf-8")
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=num_steps, desc="outer", unit="step", dynamic_ncols=True)
    start_step = state.step
    t_start = t_last = time.perf_counter()
    steps_since = 0
    try:
        for i in range(start_step, start_step + num_steps):
            state, metrics = outer_step(learner, estimators, state, i, weights)
            steps_since += 1
            if (i + 1 - start_step) % log_every == 0 or i + 1 == start_step + num_steps:
                m = _to_python(metrics)
                now = time.perf_counter()
                m["step"] = i + 1
                m["inner_steps_per_s"] = inner_per_step * steps_since / max(now - t_last, 1e-9)
                m["elapsed_s"] = now - t_start
                t_last, steps_since = now, 0
                if log_file is not None:
                    log_file.write(json.dumps(m) + "\n")
                    log_file.flush()
                if bar is not None:
                    loss = m["meta_loss"]
                    bar.set_postfix(meta_loss=f"{loss:.4f}" if math.isfinite(loss) else "nan",
                                    inner_steps_s=f"{m['inner_steps_per_s']:.3g}", dropped=m["num_dropped"])
                if callback is not None:
                    callback(i + 1, state, m)
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
        if log_file is not None:
            log_file.close()
    if output_dir is not None:
        save_theta(os.path.join(output_dir, "theta_final.msgpack"), learner.learned_opt, state.theta)
    return state

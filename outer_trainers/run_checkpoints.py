"""The checkpoints of an outer-training run: restore-or-init, and the saves after each step.

    run = RunCheckpoints(output_dir, policy, run_metadata(learner, estimators, config))
    state, totals = run.restore_or_init(init, key)      # the newest matching checkpoint, or init(key)
    ...
    run.save(step, state, totals, logged_metrics, final=step == num_steps)

Checkpoints are written under `output_dir/checkpoints` (files and policy: see
outer_trainers.checkpoints). Each carries the run's metadata — what a checkpoint must match to
be resumed: the learned optimizer's architecture and config, the estimators and the caller's
config — and the run's RunTotals. With `output_dir=None` there are none: `restore_or_init`
initialises and `save` does nothing. Nothing here runs a loop, so a learner fed by remote
workers checkpoints and resumes the same way as `outer_train`.
"""
from __future__ import annotations

import json
import logging
import os
import time
from typing import Any, Callable, Optional, Sequence, Union

import jax

from outer_trainers.checkpoints import CheckpointManager, CheckpointPolicy
from outer_trainers.estimators.gradient_estimator import GradientEstimator
from outer_trainers.gradient_learner import GradientLearner
from outer_trainers.reporting import RunTotals

logger = logging.getLogger("outer_trainers")
CHECKPOINT_DIR = "checkpoints"


def run_metadata(learner: GradientLearner, estimators: Sequence[Union[GradientEstimator, str]],
                 config: Optional[dict] = None) -> dict:
    """What a checkpoint must match to be resumed.

    Args:
        learner: the run's GradientLearner (its learned optimizer's class name and `config()` count).
        estimators: the run's estimators (recorded by `name`) or labels such as an EstimatorSchedule's repr.
        config: JSON-able run configuration that must match too (e.g. the run's gin bindings), or None.

    Returns:
        {"architecture": ..., "lopt_config": ..., "estimators": [...]} (+ "config"), JSON-normalised.
    """
    lo = learner.learned_opt
    labels = [e if isinstance(e, str) else e.name for e in estimators]
    meta = {"architecture": type(lo).__name__, "lopt_config": json.loads(json.dumps(lo.config(), sort_keys=True)),
            "estimators": labels}
    if config is not None:
        meta["config"] = json.loads(json.dumps(config, sort_keys=True))
    return meta


class RunCheckpoints:
    """Restores and saves the checkpoints of one run in `output_dir/checkpoints`.

    Args:
        output_dir: the run's directory; None keeps no checkpoints.
        policy: when to save (a CheckpointPolicy; default `CheckpointPolicy()`).
        meta: the run's metadata (`run_metadata`): stored in every checkpoint and required to match on restore.
    """

    def __init__(self, output_dir: Optional[str], policy: Optional[CheckpointPolicy] = None,
                 meta: Optional[dict] = None):
        self.policy = policy or CheckpointPolicy()
        self.meta = dict(meta or {})
        self.manager = None
        if output_dir is not None:
            self.manager = CheckpointManager(os.path.join(output_dir, CHECKPOINT_DIR), self.policy)
            self.manager.mark_time(time.perf_counter())

    def newest_step(self) -> Optional[int]:
        """The step of the newest checkpoint file (readable or not), or None when there is none."""
        found = self.manager.all() if self.manager is not None else []
        return found[0][0] if found else None

    def restore_or_init(self, init: Callable[[jax.Array], Any], key: jax.Array, *, resume: bool = True,
                        structure_at: Optional[Callable[[int], Any]] = None) -> tuple[Any, RunTotals]:
        """The state and totals of the newest readable checkpoint, or `init(key)` and zero totals.

        A checkpoint that reads but does not match the metadata or the state's structure raises
        ValueError (it is never skipped); unreadable ones are skipped with a warning.

        Args:
            init: `init(key) -> state`, the initial state of a new run.
            key: the run's PRNG key, for `init`.
            resume: False ignores existing checkpoints and initialises.
            structure_at: `structure_at(step)` -> the structure (e.g. via `jax.eval_shape`) of the state a
                checkpoint written at `step` holds, for runs whose state changes structure over time (an
                EstimatorSchedule); default: that of `init(key)`.

        Returns:
            (state, totals).
        """
        newest = self.newest_step() if resume else None
        if newest is not None:
            template = jax.eval_shape(init, key) if structure_at is None else structure_at(newest)
            found = self.manager.restore_latest(template, expect=self.meta)
            if found is not None:
                state, payload = found
                logger.info("resuming from step %d (%s)", payload["step"], self.manager.directory)
                return state, RunTotals.from_meta(payload["meta"])
        return init(key), RunTotals()

    def save(self, step: int, state: Any, totals: RunTotals, metrics: Optional[dict] = None, *,
             final: bool = False) -> None:
        """Saves the checkpoints the policy wants after outer step `step`.

        Rolling and permanent checkpoints as `CheckpointManager.due` says; a "best" one when
        `metrics` holds `policy.best_metric` and it improves on the best so far.

        Args:
            step: outer steps taken.
            state: the state to save.
            totals: the run's totals now (stored with the metadata).
            metrics: this step's logged metrics, or None when the step was not logged.
            final: whether this is the session's last step (`policy.save_final` saves then).
        """
        if self.manager is None:
            return
        now = time.perf_counter()
        meta = dict(self.meta, **totals.as_meta())
        self.manager.save(step, state, meta, kinds=self.manager.due(step, now, final=final), now=now)
        best = self.policy.best_metric
        if metrics is not None and best and best in metrics:
            self.manager.save_best(step, state, metrics[best], meta)

"""What a meta-training run records about itself: the metadata a resume must match, and metric labels.

`run_metadata` describes the learner and estimators for `runs.RunCheckpoints` (which stores it and
refuses a resume that does not match); `estimator_labels` names each estimate's metrics for
`runs.Reporter`. The run files themselves know nothing of learners or estimators.
"""
from __future__ import annotations

import json
from typing import Optional, Sequence, Union

from outer_trainers.estimators.gradient_estimator import GradientEstimator
from outer_trainers.learner.gradient_learner import GradientLearner


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


def estimator_labels(estimators: Sequence[GradientEstimator]) -> list[str]:
    """The names under which per-estimate metrics are logged, e.g. "meta_loss/TruncatedPES/quadratic_dim4".

    Args:
        estimators: the estimators of an outer step, in the order of their estimates.

    Returns:
        One label per estimator: "<estimator class>/<its truncated step's name>" (for a
        LOptTruncatedStep, the task family's name), with "_<index>" appended when two coincide.
    """
    labels = [f"{type(e).__name__}/{e.truncated_step.name}" for e in estimators]
    return [lab if labels.count(lab) == 1 else f"{lab}_{i}" for i, lab in enumerate(labels)]

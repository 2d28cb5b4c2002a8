"""The learner and the outer loop: theta, its optimizer, and the loop that updates it.

`gradient_learner` (`GradientLearner`: average estimates, drop non-finite ones, outer update),
`outer_optimizers` (optax chains for theta), `outer_train` (the local meta-training loop),
`meta_eval` (periodic meta-evaluation of theta on held-out tasks), `validation_selection`
(`ValidationSelector`: theta scored on validation tasks against a tuned baseline, for choosing the
run's best theta), `theta_best` (that best theta's files, theta_best.msgpack and its record),
`run_records` (what a run records about itself for resume checks and metric labels),
`run_settings` (the settings groups of a meta-training run: `MetaEval`, `Comparison`, `Validation`,
`Reporting`).

Two modules sit above the loop and are not re-exported (they use the whole package, Ray
meta-training and the evaluation included): `meta_training_run` (one run in an output directory,
step by step: argument checks, the output-directory policy, local or Ray meta-training, the
comparison with Adam) and `gin_run` (those steps as the gin-configurable `train` of
scripts/outer_train.py, and `GinRun`, the picklable description Ray workers rebuild it from).
Neither imports distributed/: a run on Ray workers is handed what runs them (`RayWorkers`).
"""
from outer_trainers.learner.gradient_learner import GradientLearner, LearnerState
from outer_trainers.learner.meta_eval import MetaEvaluator
from outer_trainers.learner.outer_optimizers import chained
from outer_trainers.learner.outer_train import (OuterTrainState, init_outer_state, outer_step, outer_train,
                                                resample_estimators)
from outer_trainers.learner.run_settings import Comparison, MetaEval, Reporting, Validation
from outer_trainers.learner.validation_selection import ValidationSelector

__all__ = ["GradientLearner", "LearnerState", "MetaEvaluator", "chained", "OuterTrainState", "init_outer_state",
           "outer_step", "outer_train", "resample_estimators", "ValidationSelector", "MetaEval", "Comparison",
           "Validation", "Reporting"]

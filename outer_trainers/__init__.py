"""Meta-training: truncation schedules, unrolled systems, gradient estimators, learner, outer loop."""
from outer_trainers.estimator_schedule import EstimatorSchedule
from outer_trainers.devices import use_all_cpu_cores
from outer_trainers.estimators import (Estimate, FullES, FullGrad, GradientEstimator, NoiseReuseES, TruncatedES,
                                       TruncatedGrad, TruncatedPES, TruncatedPESPMAP, default_compiler_options)
from outer_trainers import protocol
from outer_trainers.evaluation import (best_runs, compare_optimizers, format_comparison, lr_grid, make_task_trainer,
                                       run_settings)
from outer_trainers.gradient_learner import GradientLearner, LearnerState
from outer_trainers.lopt_truncated_step import LOptInnerState, LOptTruncatedStep
from outer_trainers.outer_train import (OuterTrainState, init_outer_state, outer_step, outer_train,
                                        resample_estimators)
from outer_trainers.reporting import MetaTrainingDiverged, Reporter, RunTotals
from outer_trainers.run_checkpoints import ExistingRunError, RunCheckpoints, theta_from_checkpoint
from outer_trainers.truncated_step import StepOut, TruncatedStep
from outer_trainers.truncation_schedule import (ConstantTruncationSchedule, LogUniformTruncationSchedule,
                                                NeverEndingTruncationSchedule, TruncationSchedule,
                                                TruncationState)
from outer_trainers.checkpoints import CheckpointManager, CheckpointPolicy, UnreadableCheckpointsError
from outer_trainers.meta_eval import MetaEvaluator
from outer_trainers.multi_family import estimator_on_family
from outer_trainers.outer_optimizers import chained
from outer_trainers.train_eval import Evaluation, Evaluator
from outer_trainers.train_loop import TrainResult, run_to_end, train_loop
from outer_trainers.train_model import train_model
from outer_trainers.train_state import TrainState
from outer_trainers.distributed import pbt_outer_train, pbt_reports, ray_outer_train

__all__ = [
    "EstimatorSchedule",
    "TruncationSchedule", "TruncationState", "ConstantTruncationSchedule", "LogUniformTruncationSchedule",
    "NeverEndingTruncationSchedule", "TruncatedStep", "StepOut", "LOptTruncatedStep", "LOptInnerState",
    "GradientEstimator", "Estimate", "default_compiler_options", "TruncatedES", "TruncatedPES",
    "GradientLearner", "LearnerState",
    "OuterTrainState", "outer_train", "outer_step", "init_outer_state", "resample_estimators",
    "Reporter", "RunTotals", "RunCheckpoints", "theta_from_checkpoint", "MetaTrainingDiverged",
    "ExistingRunError", "UnreadableCheckpointsError",
    "protocol", "best_runs", "compare_optimizers", "format_comparison", "make_task_trainer", "run_settings", "lr_grid",
    "FullES", "FullGrad", "NoiseReuseES", "TruncatedGrad", "TruncatedPESPMAP",
    "CheckpointPolicy", "CheckpointManager", "MetaEvaluator", "train_model", "TrainState", "TrainResult",
    "train_loop", "run_to_end", "Evaluation", "Evaluator", "chained", "use_all_cpu_cores",
    "estimator_on_family", "ray_outer_train", "pbt_outer_train", "pbt_reports",
]

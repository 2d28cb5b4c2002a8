"""Meta-training learned optimizers, and training and evaluating models with them.

Subpackages, one concept each:

- `steps`: unrolled systems (`TruncatedStep`, `LOptTruncatedStep`) and truncation schedules;
- `estimators`: meta-gradient estimators (ES, PES, sharded PES, NRES, truncated backprop);
- `learner`: `GradientLearner` and the local outer loop `outer_train`;
- `distributed`: the same loop on a Ray cluster, and population-based training;
- `training`: the model training loop (`train_loop`, `train_model`);
- `runs`: run files: checkpoints, progress reports, summaries;
- `evaluation`: task trainers, tuned baselines, and the evaluation protocol.

Every public name is re-exported here: `from outer_trainers import TruncatedPES`.
"""
from outer_trainers.devices import use_all_cpu_cores
from outer_trainers.estimators import (Estimate, EstimatorSchedule, FullES, FullGrad, GradientEstimator, NoiseReuseES,
                                       ShardedTruncatedPES, TruncatedES, TruncatedGrad, TruncatedPES,
                                       TruncatedPESPMAP, default_compiler_options, estimator_on_family)
from outer_trainers.evaluation import (best_runs, compare_optimizers, format_comparison, lr_grid, make_task_trainer,
                                       protocol, run_settings)
from outer_trainers.learner import (GradientLearner, LearnerState, MetaEvaluator, OuterTrainState, Reporting,
                                    ValidationSelector, chained, init_outer_state, outer_step, outer_train,
                                    resample_estimators)
from outer_trainers.runs import (CheckpointManager, CheckpointPolicy, ExistingRunError, MetaTrainingDiverged,
                                 Reporter, RunCheckpoints, RunTotals, UnreadableCheckpointsError, theta_from_checkpoint,
                                 theta_from_file)
from outer_trainers.steps import (ConstantTruncationSchedule, LOptInnerState, LOptTruncatedStep,
                                  LogUniformTruncationSchedule, NeverEndingTruncationSchedule,
                                  PowerLawTruncationSchedule, StepOut, TruncatedStep,
                                  TruncationSchedule, TruncationState)
from outer_trainers.training import (EvalPlan, Evaluation, Evaluator, LoopOptions, ParamSharding, TrainResult,
                                     TrainState, run_to_end, train_loop, train_model)
from outer_trainers.distributed import pbt_outer_train, pbt_reports, ray_outer_train

__all__ = [
    "EstimatorSchedule",
    "TruncationSchedule", "TruncationState", "ConstantTruncationSchedule", "LogUniformTruncationSchedule",
    "NeverEndingTruncationSchedule", "PowerLawTruncationSchedule", "TruncatedStep", "StepOut", "LOptTruncatedStep",
    "LOptInnerState",
    "GradientEstimator", "Estimate", "default_compiler_options", "TruncatedES", "TruncatedPES",
    "GradientLearner", "LearnerState",
    "OuterTrainState", "outer_train", "outer_step", "init_outer_state", "resample_estimators", "Reporting",
    "Reporter", "RunTotals", "RunCheckpoints", "theta_from_checkpoint", "theta_from_file", "MetaTrainingDiverged",
    "ExistingRunError", "UnreadableCheckpointsError",
    "best_runs", "compare_optimizers", "format_comparison", "make_task_trainer", "run_settings", "lr_grid",
    "FullES", "FullGrad", "NoiseReuseES", "TruncatedGrad", "TruncatedPESPMAP", "ShardedTruncatedPES",
    "CheckpointPolicy", "CheckpointManager", "MetaEvaluator", "ValidationSelector", "train_model", "TrainState",
    "TrainResult", "train_loop", "run_to_end", "Evaluation", "Evaluator", "EvalPlan", "LoopOptions", "ParamSharding",
    "chained",
    "use_all_cpu_cores",
    "estimator_on_family", "ray_outer_train", "pbt_outer_train", "pbt_reports",
]

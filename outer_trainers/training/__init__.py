"""Training one model with a (learned or hand-designed) optimizer: the model training loop.

`train_state` (the pure train step and its state), `train_setup` (a run's arguments, checked and
resolved before it starts), `train_loop` (the loop: data, evaluation, checkpoints, summaries,
resume), `train_resume` (what a run checkpoints, how it resumes and is extended to more steps),
`train_model` (the one-call wrapper), `train_sharding` (the state split over a mesh axis:
`ParamSharding`), `train_eval` (evaluating a model on a split during
training; `EvalPlan`, what and when). Nothing here imports meta-training code (steps, estimators, learner, distributed).
"""
from outer_trainers.training.train_eval import EvalPlan, Evaluation, Evaluator
from outer_trainers.training.train_loop import TrainResult, run_to_end, run_training, train_loop
from outer_trainers.training.train_model import train_model
from outer_trainers.training.train_resume import check_training_start
from outer_trainers.training.train_setup import LoopOptions, RunFiles, TrainingSetup, prepare_training
from outer_trainers.training.train_sharding import ParamSharding
from outer_trainers.training.train_state import TrainState

__all__ = ["Evaluation", "Evaluator", "EvalPlan", "TrainResult", "run_to_end", "run_training", "train_loop",
           "train_model",
           "LoopOptions", "ParamSharding", "RunFiles", "TrainingSetup", "prepare_training", "TrainState", "check_training_start"]

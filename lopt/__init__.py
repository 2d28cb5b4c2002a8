"""Learned optimizers, hand-designed baselines with learnable hyper-parameters, optax interop."""
from lopt.base import LearnedOptimizer, architecture, architectures
from lopt.learnable_hparams import LearnableAdam, LearnableSGD, LearnableSGDM
from lopt.mlp_lopt import MLPLOpt, MLPLOptState
from lopt.serialization import load_learned_optimizer, load_optimizer, load_theta, save_theta

__all__ = [
    "LearnedOptimizer", "architecture", "architectures",
    "MLPLOpt", "MLPLOptState", "LearnableAdam", "LearnableSGD", "LearnableSGDM",
    "save_theta", "load_theta", "load_learned_optimizer", "load_optimizer",
]

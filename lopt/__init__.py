"""Learned optimizers, hand-designed baselines with learnable hyper-parameters, optax interop.

From PyTorch: `import lopt.torch; lopt.torch.optimizer(name, model.parameters(), num_steps=N)` (needs torch).
"""
from lopt.archs.adafac_mlp_lopt import AdafacMLPLOpt, AdafacState
from lopt.base import LearnedOptimizer, architecture, architectures
from lopt.archs.hyper_lopt import HyperLOpt, HyperLOptState
from lopt.archs.learnable_hparams import LearnableAdam, LearnableSGD, LearnableSGDM
from lopt.archs.learnable_decay import LearnableAdamW
from lopt.archs.mlp_lopt import MLPLOpt, MLPLOptState
from lopt.archs.nn_adam import NNAdam, NNAdamState
from lopt.archs.norm_mlp_lopt import NormMLPLOpt, NormMLPLOptState
from lopt.archs.celo2_lopt import Celo2LOpt, Celo2LOptState
from lopt.archs.celo import Celo, CeloState
from lopt.archs.celo_adam import CeloAdam, CeloAdamState
from lopt.archs.rnn_mlp_lopt import RNNMLPLOpt, RNNMLPLOptState
from lopt.serialization import load_learned_optimizer, load_optimizer, load_theta, save_theta
from lopt import pretrained  # after serialization: it loads the shipped theta files with it
from lopt import published

__all__ = [
    "LearnedOptimizer", "architecture", "architectures",
    "MLPLOpt", "MLPLOptState", "AdafacMLPLOpt", "AdafacState", "RNNMLPLOpt", "RNNMLPLOptState",
    "NNAdam", "NNAdamState", "NormMLPLOpt", "NormMLPLOptState", "Celo2LOpt", "Celo2LOptState",
    "HyperLOpt", "HyperLOptState", "Celo", "CeloState", "CeloAdam", "CeloAdamState",
    "LearnableAdam", "LearnableAdamW", "LearnableSGD", "LearnableSGDM",
    "save_theta", "load_theta", "load_learned_optimizer", "load_optimizer", "pretrained", "published",
]

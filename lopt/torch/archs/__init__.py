"""The torch update rules, one module per architecture family of `lopt.archs` (same module names).

Importing this package registers every rule (`lopt.torch.rule.register`). The modules share
their helpers through `lopt.torch.parts` and `lopt.torch.rules`, never by importing each other.
"""
from lopt.torch.archs import (adafac_mlp_lopt, celo, celo2_lopt, celo_adam, hyper_lopt,  # noqa: F401
                              learnable_decay, learnable_hparams, mlp_lopt, nn_adam, norm_mlp_lopt, rnn_mlp_lopt)

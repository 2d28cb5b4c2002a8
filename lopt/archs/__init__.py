"""The learned-optimizer architectures, one module per family.

- `mlp_lopt.MLPLOpt`: a per-parameter MLP on momentum features (Metz et al. 2019).
- `adafac_mlp_lopt.AdafacMLPLOpt`: the same with Adafactor-style factored features.
- `rnn_mlp_lopt.RNNMLPLOpt`: a per-tensor LSTM that generates the per-parameter MLP's inputs.
- `nn_adam.NNAdam`: Adam whose hyper-parameters an LSTM sets per tensor and step.
- `hyper_lopt.HyperLOpt`: a per-tensor LSTM that generates the per-parameter MLP's weights.
- `learnable_hparams`: SGD, SGDM and Adam with learned hyper-parameters.
- `learnable_decay.LearnableAdamW`: AdamW with a learned lr and a learned, signed weight decay.
- `norm_mlp_lopt.NormMLPLOpt`: normalized Adam plus a learned residual, a learned bounded step size.
- `celo2_lopt.Celo2LOpt`: a learned, Muon-orthogonalized matrix update and AdamW for the rest.
- `celo.Celo`, `celo_adam.CeloAdam`: the published Celo and Celo-Adam (Moudgil et al. 2025), a
  per-parameter MLP / Adam scaled by a learned LSTM scheduler (`lopt.published` runs their weights).

Each composes the parts of `lopt.parts` (features, update layout, moment features, step-size
heads, Newton–Schulz) and the rules of `lopt.rules` (schedule, horizon, depth, overshoot brake).
"""

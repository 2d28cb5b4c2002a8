"""The torch parts the update rules of `lopt.torch.archs` share, each mirroring its JAX module of `lopt.parts`.

- `features`: step embedding, progress and loss features, the per-tensor LSTMs' inputs.
- `layout`: the blocks a rule walks a big tensor in, and the scratch memory it reuses.
- `moment_features`: momentum / second-moment accumulators and their features.
- `factored`: Adafactor-style factored accumulators and their features.
- `learned_scheduler`: Celo's learned scheduler (one step-size multiplier per step, from t/N and the loss history).
- `spec`: a parameter's state from an architecture's spec (`lopt.parts.spec`), feature rows by name.
- `nn`: the LSTM step and state, the per-parameter MLP as GEMMs, the first layer's shared bias.
- `newton_schulz`: optax's Newton–Schulz orthogonalization and the width-scaled matrix step.

The submodules are not imported here: `lopt.torch.rule` imports some of them.
"""

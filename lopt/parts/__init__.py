"""The parts learned-optimizer architectures are built from, each in a module named after it.

- `features`: per-step and per-tensor features (step embedding, progress, loss, LSTM inputs).
- `layout`: the update layout, how per-parameter work is cut into blocks (`UpdateLayout`).
- `tree_checks`: trace-time checks of pytrees (gradients against params, theta against its spec).
- `moment_features`: momentum / second-moment accumulators and the features read from them.
- `factored`: Adafactor-style factored accumulators and the features read from them.
- `spec`: an architecture's written spec (feature order, constants, state layout), read by JAX and torch.
- `nn`: tiny networks as pure functions (dense, LSTM, element-wise MLPs).
- `step_size`: learned step-size heads bounded around a base step size.
- `newton_schulz`: Muon's orthogonalization of matrix updates and its width scale.
- `float32`: an optax transform run in float32 (float32 state, updates in each parameter's dtype).
"""

"""The rules applied on top of a learned update, in torch, each mirroring its JAX module of `lopt.rules`.

- `schedule`: the prior schedule σ(t, N) a learned step size multiplies; `scheduled` wraps an optimizer.
- `horizon`: min(1, N_ref/N)^α, for horizons longer than the meta-trained ones; `horizon_scaled`.
- `depth`: min(1, D_ref/D)^γ on the weight matrices' steps; `depth_scaled`.
- `conv_step`: every step of a model with a conv kernel times c; `conv_step_scaled`.
- `overshoot_brake`: every step scaled by α_t ≤ 1 while gradients point back along the last one;
  `overshoot_brake` wraps an optimizer.
- `weight_decay`: λ, fixed or learned, of the decoupled decay η(p)·λ·p (which roles decay:
  `lopt.rules.weight_decay.is_decayed`); `loss_aware_decay` wraps an optimizer.
- `radial`: the growth limit; `growth_limited`.
- `scaled`: what the wrappers share (`RuleOptimizer`, `ScaledOptimizer`).

Each wrapper takes any `torch.optim.Optimizer` and the constants of its JAX part, with the same
name and arguments (`role=` in place of `weight_dimension_numbers=`), and moves the parameters as
the JAX part moves them (tests/lopt/torch/test_rule_parts.py).
"""

"""The rules applied on top of a learned update, in torch, each mirroring its JAX module of `lopt.rules`.

- `schedule`: the prior schedule σ(t, N) a learned step size multiplies.
- `horizon`: min(1, N_ref/N)^α, for horizons longer than the meta-trained ones.
- `overshoot_brake`: every step scaled by α_t ≤ 1 while gradients point back along the last one.
- `weight_decay`: λ, fixed or learned, of the decoupled decay η(p)·λ·p (which roles decay:
  `lopt.rules.weight_decay.is_decayed`).

(The depth rule's D and factor come from `lopt.rules.depth.matrix_depth` and
`learned_opt.depth_scale(D)` directly.)
"""

"""Rules applied on top of a learned update, each a small named part an architecture composes.

- `schedule`: the prior schedule σ(t, N) a learned step size multiplies (constant, warm-up + cosine).
- `horizon`: min(1, N_ref/N)^α, for horizons longer than the meta-trained ones.
- `depth`: min(1, D_ref/D)^γ on the matrix step size, D the number of orthogonalized tensors.
- `overshoot_brake`: a transform wrapper that shrinks steps while gradients point back along the last one.
- `weight_decay`: decoupled weight decay η(p)·λ·p on weight matrices, λ fixed or a learned meta-parameter.

Most are deployment rules: a shipped optimizer's `deploy_options` (`lopt.pretrained`) set them. The
weight-decay rule's learned λ is meta-trained with the rest of theta.
"""

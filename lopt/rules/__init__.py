"""Deploy rules: each one named part that wraps any optax transform with its constants given.

    tx = lopt.rules.loss_aware_decay(optax.adam(1e-3), 1e-3, 0.03, loss_free=3.0)   # one rule on Adam
    tx = lopt.rules.horizon_scaled(lopt.rules.scheduled(optax.adamw(1e-3), N), N, reference=2000)

- `schedule`: the prior schedule σ(t, N), warm-up + cosine over the horizon; `scheduled` wraps a transform.
- `horizon`: min(1, N_ref/N)^α, for horizons longer than the meta-trained ones; `horizon_scaled`.
- `depth`: min(1, D_ref/D)^γ on the matrix steps, D the number of weight matrices; `depth_scaled`.
- `conv_step`: every step of a model with a conv kernel times c; `conv_step_scaled`.
- `weight_decay`: decoupled weight decay η·λ·p on weight matrices, λ fixed, learned, or growing as
  the training loss falls; `loss_aware_decay`.
- `radial`: the growth limit, no step may grow a weight matrix past g × LeCun's scale; `growth_limited`.
- `overshoot_brake`: shrinks steps while gradients point back along the last one; `overshoot_brake.overshoot_brake`.
- `scaled`: the wrapper the step-size rules share (`scale_updates`).

- `per_tensor`: how a rule outside a learned update reaches its per-tensor quantities (each tensor's
  step size η, the learned residual): `loss_aware_decay(tx, None, ...)` and `growth_limited` around a
  learned update act inside it, as its architecture would.

- `chain`: a rule chain given as data (a list of {"part": NAME, constants}), wrapped innermost first
  (`chain.apply`); a shipped optimizer's record holds one (`lopt.pretrained.rule_chain`).
- `learned`: a learned optimizer inside a chain whose constants are meta-parameters in theta
  (`learned.with_rules(lo, chain, learnable=("loss_aware_decay.rate", ...))`), so meta-training learns them.
"""
from lopt.rules import chain, learned
from lopt.rules.conv_step import conv_step_scaled
from lopt.rules.depth import depth_scaled
from lopt.rules.horizon import horizon_scaled
from lopt.rules.radial import growth_limited
from lopt.rules.schedule import scheduled
from lopt.rules.learned import with_rules
from lopt.rules.weight_decay import loss_aware_decay

__all__ = ["scheduled", "horizon_scaled", "depth_scaled", "conv_step_scaled", "loss_aware_decay", "growth_limited",
           "with_rules"]

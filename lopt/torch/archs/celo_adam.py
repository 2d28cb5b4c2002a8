"""CeloAdam's update in torch (`lopt.archs.celo_adam`): Adam whose learning rate is Celo's learned scheduler's.

Per parameter, t the updates it made so far and s the scheduler's multiplier of this step
(`lopt.torch.parts.learned_scheduler`):

    g ← clip(g, ±grad_clip),  m ← β1 m + (1 − β1) g,  v ← β2 v + (1 − β2) g²
    Δp = −(m / (1 − β1^{t+1})) · (s · step_mult) / (ε + √(v / (1 − β2^{t+1}) + sqrt_eps))

(grad_clip and sqrt_eps the spec's constants; the moments in the parameter's own layout, as
every elementwise field.)
"""
from __future__ import annotations

import torch

from lopt.torch.parts import learned_scheduler
from lopt.torch.parts.moment_features import pow_f32
from lopt.torch.rule import Rule, register

__all__ = ["CeloAdamRule"]


@register("CeloAdam")
class CeloAdamRule(Rule):
    """`lopt.CeloAdam`'s update (the math is in the module docstring).

    Args:
      learned_opt: the `lopt.CeloAdam`.
      theta: its meta-parameters (numpy arrays).
    """

    reads_loss = True
    requires_horizon = True

    def init_state(self, param, axes, dtype):
        return learned_scheduler.init_state(super().init_state(param, axes, dtype), self.theta["scheduler"])

    def updates(self, items, ctx):
        lo, consts = self.learned_opt, self.spec.constants
        s = learned_scheduler.multipliers("CeloAdam", items, ctx)
        lrs = s * torch.tensor(lo.step_mult, dtype=torch.float32).to(ctx.dtype)
        t1 = ctx.steps + 1.0
        bc1, bc2 = 1.0 - pow_f32(lo.b1, t1, ctx.dtype), 1.0 - pow_f32(lo.b2, t1, ctx.dtype)
        b1, b2, eps = (torch.tensor(x, dtype=torch.float32).to(ctx.dtype) for x in (lo.b1, lo.b2, lo.eps))
        for i, it in enumerate(items):
            g = torch.clamp(it.grad.detach().to(ctx.dtype), -consts["grad_clip"], consts["grad_clip"])
            mu, nu = it.state["mu"], it.state["nu"]
            mu.mul_(b1).add_((1.0 - b1) * g)
            nu.mul_(b2).add_((1.0 - b2) * (g * g))
            yield -((mu / bc1[i]) * (lrs[i] / (eps + torch.sqrt(nu / bc2[i] + consts["sqrt_eps"]))))

"""Celo2LOpt's update in torch (`lopt.archs.celo2_lopt`): a learned direction for weight
matrices, orthogonalized by Muon's Newton–Schulz, and NAdamW for the other tensors.

Per tensor, with MLPLOpt's accumulators and features (`lopt.torch.parts.moment_features.FlatLeaf`),
t the updates so far:

    b   = β m_β / (1 − β^(t+2)) + (1 − β) g / (1 − β^(t+1))     optax.contrib.muon's Nesterov momentum
    matrix:  u = b / (rms(b) + ε_norm) + MLP(x)                  x RMS-normalised (folded into the first layer)
             Δp = −η_matrix · (width_scale · NS(u) + λ p)
    other:   Δp = −η_adam · (b / (√(v / (1 − β_v^(t+1))) + ε_adam) + λ p)

(η_matrix, η_adam) = (matrix_lr, adam_lr) · exp(log_lr_range · tanh(s)), s from the step-size MLP
on [emb(t), progress(t, N), loss features], times the prior schedule σ(t, N) and the horizon factor
min(1, N_ref/N)^α (`horizon_reference`, `horizon_power`; 1 when off); MLP(x) times
min(1, N_ref/N)^`residual_horizon_power` where that is set; η_matrix also times the depth factor
min(1, D_ref/D)^γ (`depth_reference`, `depth_power`; 1 when off), D the number of orthogonalized
parameters of the step (every device and dtype). NS is optax's `orthogonalize_via_newton_schulz`
(`lopt.torch.parts.newton_schulz.newton_schulz`: Frobenius pre-normalisation, quintic steps with
Muon's coefficients, the wide orientation; its constants the spec's "ns_coeffs", "ns_steps",
"ns_eps") of u read as the matrix [fan_in, fan_out] in JAX layout, and width_scale = √max(1, fan_out / fan_in)
(`lopt.parts.newton_schulz.width_scale`).

Each parameter's role (`lopt.param_roles`) is its group's `role` option, as for NormMLPLOpt
(`lopt.torch.param_roles.role_of`): by default "matrix" from 2 axes, with the input axes every
JAX-layout axis but the last (dense [in, out], conv [*spatial, in, out]: the axes the JAX side
infers for them), and "vector" below. "embedding" and "vector" take the NAdamW path, and so does
a "matrix" with a single input or output (`lopt.parts.newton_schulz.is_orthogonalized`).

With `wd_rate` λ₀ > 0 the weight-decay rule (`lopt.torch.rules.weight_decay`) adds λ p to the
bracket of every parameter whose role's kind is in `wd_roles`, λ = λ₀ or, with `wd_learned`,
λ₀ · exp(`wd_log_range` · tanh(theta["weight_decay"]["s"])); with `wd_loss_power` > 0, λ also
multiplies the loss-aware factor (`lopt.torch.rules.weight_decay.loss_factors`; conv kernels with
`wd_conv_loss_free` > 0 their own ρ_free). In a model with a conv kernel both step sizes multiply `conv_step_scale`. With
`residual_no_growth` the learned residual loses its component that grows ‖p‖ (`lopt.rules.radial`),
in the matrices past rms(p) · √fan_in = `residual_growth_free`.

With `overshoot_gain` κ > 0 the rule carries the overshoot brake (`lopt.torch.rules.overshoot_brake`),
which `TorchLearnedOptimizer.step` applies over all parameters: every Δp scaled by α_t ≤ 1.
"""
from __future__ import annotations

import torch

from lopt.parts.newton_schulz import is_orthogonalized
from lopt.rules import radial
from lopt.rules.depth import matrix_depth
from lopt.rules.weight_decay import is_decayed, loss_free_of
from lopt.torch.param_roles import jax_role, role_of
from lopt.torch.parts.moment_features import FlatLeaf, pow_f32
from lopt.torch.parts.newton_schulz import orthogonalized_step
from lopt.torch.parts.nn import as_columns
from lopt.torch.parts.step_size import bounded_step_sizes
from lopt.torch.rule import Context, Rule, register
from lopt.torch.rules.horizon import horizon_scale
from lopt.torch.rules.schedule import prior_schedule
from lopt.parts.features import loss_state_field
from lopt.torch.rules.learned import RuledLOptRule
from lopt.torch.rules.weight_decay import decay_rate, loss_factors

__all__ = ["Celo2LOptRule"]

# lopt.rules.with_rules(...) around Celo2LOpt (or another architecture): its inner rule, the chain as its fields
register("RuledLOpt")(RuledLOptRule)


@register("Celo2LOpt")
class Celo2LOptRule(Rule):
    """`lopt.Celo2LOpt`'s update (the math is in the module docstring).

    Args:
      learned_opt: the `lopt.Celo2LOpt`.
      theta: its meta-parameters (numpy arrays).
    """

    flat_momenta = True
    reads_loss = True
    reads_roles = True

    def init_state(self, param, axes, dtype, role=None):
        state = super().init_state(param, axes, dtype)
        state["role"] = role_of(param, role)
        return state

    def step_sizes(self, ctx: Context, items, loss_feats: torch.Tensor) -> torch.Tensor:
        """(η_matrix, η_adam) per item, times the prior schedule σ: [L, 2]."""
        lo, lr = self.learned_opt, ctx.theta["lr"]
        z = ctx.context_row(lo.timescales, items, loss_feats, lo.use_num_steps)
        base = torch.tensor([lo.matrix_lr, lo.adam_lr], dtype=ctx.dtype, device=ctx.device)
        sigma = prior_schedule(lo.schedule, ctx, items) * horizon_scale(lo.horizon_reference, lo.horizon_power, ctx, items)
        stepped = ctx.stepped or items
        roles = [jax_role(it.state.get("role") or role_of(it.param), it.jax_shape) for it in stepped]
        depth = matrix_depth([it.jax_shape for it in stepped], roles)
        base = base * torch.tensor([lo.depth_scale(depth), 1.0], dtype=ctx.dtype, device=ctx.device) * lo.model_scale(roles)
        return bounded_step_sizes(lr, z, base, lo.log_lr_range) * sigma[:, None]

    def updates(self, items, ctx):
        lo, mlp, consts = self.learned_opt, ctx.theta["mlp"], self.spec.constants
        loss_aware = lo.wd_rate > 0 and lo.wd_loss_power > 0
        old_loss = torch.stack([it.state[loss_state_field().key] for it in items]) if loss_aware else None
        loss_feats = self.loss_features(items, ctx)
        lrs = self.step_sizes(ctx, items, loss_feats)
        rest = as_columns([(mlp[f"hidden_{i}"]["w"], mlp[f"hidden_{i}"]["b"])
                           for i in range(1, lo.hidden_layers)] + [(mlp["output"]["w"], mlp["output"]["b"])])
        decays = torch.tensor(lo.decays, dtype=ctx.dtype, device=ctx.device)
        idx = lo.momentum_index
        beta = lo.decays[idx]
        t1 = ctx.steps + 1.0
        # b = c_m m_β + c_g g: the momentum bias-corrected one step ahead (Nesterov), the gradient at t + 1
        c_m = beta / (1.0 - pow_f32(beta, t1 + 1.0, ctx.dtype))
        c_g = (1.0 - beta) / (1.0 - pow_f32(beta, t1, ctx.dtype))
        bc_v = 1.0 - pow_f32(lo.rms_decay, t1, ctx.dtype)
        fade = None  # the learned residual's horizon factor per item, where one is set
        if lo.horizon_reference > 0 and lo.residual_horizon_power > 0:
            fade = horizon_scale(lo.horizon_reference, lo.residual_horizon_power, ctx, items)
        lam = decay_rate(ctx.theta, lo.wd_rate, lo.wd_learned, lo.wd_log_range, ctx.dtype, ctx.device)
        if loss_aware:
            new_loss = torch.stack([it.state[loss_state_field().key] for it in items])
            free = torch.tensor([loss_free_of(jax_role(it.state.get("role") or role_of(it.param), it.jax_shape),
                                              lo.wd_loss_free, lo.wd_conv_loss_free) for it in items],
                                dtype=ctx.dtype, device=ctx.device)
            lam = lam * loss_factors([it.state for it in items], old_loss, new_loss, ctx.loss, lo.wd_loss_power,
                                   lo.wd_loss_max, free)
        for i, it in enumerate(items):
            shape = tuple(it.param.shape)
            if it.param.numel() == 0:
                yield torch.zeros(shape, dtype=ctx.dtype, device=ctx.device)
                continue
            role = jax_role(it.state.get("role") or role_of(it.param), it.jax_shape)
            ortho = is_orthogonalized(role, it.jax_shape)
            leaf = FlatLeaf(it, ctx.dtype, self.spec, idx, self.ws)
            sums = leaf.accumulate_and_sum(decays, lo.rms_decay, want_sums=ortho)
            nesterov = self.ws.get("nesterov", (leaf.n,), ctx.dtype, ctx.device)
            torch.mul(leaf.m[idx], c_m[i], out=nesterov).addcmul_(leaf.g, c_g[i])
            if ortho:
                nesterov.div_(torch.sqrt(torch.dot(nesterov, nesterov) / leaf.n) + consts["norm_eps"])
                w1t = (mlp["input"]["w"] * torch.rsqrt(sums / leaf.n + consts["eps"])[:, None]).t().contiguous()

                def direction(o, s, e, out):  # b / (rms(b) + ε_norm) + MLP(x) (times the fade)
                    torch.add(nesterov[s:e], o[0] if fade is None else o[0] * fade[i], out=out)

                u = leaf.mlp_map([(w1t, mlp["input"]["b"])] + rest, direction)
                if lo.residual_no_growth:  # the residual r = u − b̂ without its part that grows ‖p‖
                    inner, sq = torch.dot(u, leaf.p) - torch.dot(nesterov, leaf.p), torch.dot(leaf.p, leaf.p)
                    coef = torch.clamp(inner, max=0.0) / (sq + radial.EPS)
                    if lo.residual_growth_free > 0:  # only past rms(p) · √fan_in = g
                        past = sq / leaf.n * role.fan_in(it.jax_shape) > lo.residual_growth_free ** 2
                        coef = torch.where(past, coef, torch.zeros_like(coef))
                    u.sub_(leaf.p * coef)
                step = orthogonalized_step(u, it, role, consts)
                lr = lrs[i, 0]
            else:
                den = torch.div(leaf.v, bc_v[i], out=self.ws.get("den", (leaf.n,), ctx.dtype, ctx.device))
                step = nesterov.div_(den.sqrt_().add_(consts["adam_eps"])).view(shape)
                lr = lrs[i, 1]
            if lo.weight_decay:
                step = step.add_(torch.mul(leaf.p.view(shape), lo.weight_decay))
            if lam is not None and is_decayed(role, lo.wd_roles):
                step = step.add_(torch.mul(leaf.p.view(shape), lam if lam.dim() == 0 else lam[i]))
            yield step.mul_(-lr)

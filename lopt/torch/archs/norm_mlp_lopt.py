"""NormMLPLOpt's update in torch (`lopt.archs.norm_mlp_lopt`; the shipped optimizers are NormMLPLOpts).

Per tensor, with MLPLOpt's accumulators and features (`lopt.torch.parts.moment_features.FlatLeaf`):

    a   = m̂_0.9 / (√v̂ + ε_adam)                     Adam's direction, bias-corrected at t + 1
    r   = MLP(x; b + emb(t) W_time)                  the learned residual (x RMS-normalised)
    u   = a + r    (or a + B tanh(r / B) with `residual_bound` B)
    u   ← NS(u)    with `orthogonalize`, 2-D tensors (both sides > 1), in JAX layout (`parts.newton_schulz`)
    u   ← clip(u / (rms(u) + ε_norm), −c, c)  with `normalize_update`, else clip(u, −c, c)
    Δp  = −η_kind · σ(t, N) · ρ(p) · u              (ndim < 2 with vector_rule "adam": −η · σ · ρ · a)

η = base_lr · exp(log_lr_range · tanh(s)), s from the step-size MLP on [emb(t), progress(t, N),
loss features]; σ the prior schedule ("constant" or warm-up + cosine over N, `lopt.torch.rules.schedule`);
ρ(p) the step scale fixed at the state's init (`relative_step`: max(rms(p₀), floor), times
√(fan_in_ref / fan_in) with fan_in = ∏ of the JAX-layout shape but its last axis, the output axis).

Each parameter's role (`lopt.torch.param_roles.role_of`) is its group's `role` option: by default "matrix" from 2
axes (the fan-in above) and "vector" below; "embedding" (e.g. nn.Embedding.weight) takes ρ without
the fan-in factor; "vector" makes a ≥ 2-D tensor bias-like (η_vector, ρ = 1, no `orthogonalize`).

With `overshoot_gain` κ > 0 the rule carries the overshoot brake (`lopt.torch.rules.overshoot_brake`),
which `TorchLearnedOptimizer.step` applies over all parameters: every Δp scaled by α_t ≤ 1.

The features' order, ε_adam, ε_norm, the feature ε and the state's entries are the architecture's
spec (`learned_opt.spec()`: "adam_eps", "norm_eps", "eps"; the state "scales" is each parameter's "scale").
"""
from __future__ import annotations

import math

import torch

from lopt.torch.param_roles import role_of
from lopt.torch.parts.moment_features import FlatLeaf, pow_f32
from lopt.torch.parts.newton_schulz import newton_schulz
from lopt.torch.parts.nn import as_columns
from lopt.torch.parts.step_size import bounded_step_sizes
from lopt.torch.rule import Context, Rule, register
from lopt.torch.rules.schedule import prior_schedule

__all__ = ["NormMLPLOptRule"]

@register("NormMLPLOpt")
class NormMLPLOptRule(Rule):
    """`lopt.NormMLPLOpt`'s update (the math is in the module docstring).

    Args:
      learned_opt: the `lopt.NormMLPLOpt`.
      theta: its meta-parameters (numpy arrays).
    """

    flat_momenta = True
    reads_loss = True
    reads_roles = True

    def init_state(self, param, axes, dtype, role=None):
        lo = self.learned_opt
        kind = role_of(param, role)
        state = super().init_state(param, axes, dtype)
        state["role"] = kind
        scale = state[self.spec.field("scales").key]  # ρ(p): 1 unless relative_step
        if lo.relative_step and kind != "vector" and param.numel() > 0:
            p = param.detach().to(dtype)
            scale = torch.clamp(torch.sqrt(torch.mean(torch.square(p))), min=lo.relative_floor)
            if lo.fan_in_ref > 0 and kind == "matrix":
                jax_shape = [param.shape[a] for a in axes]
                scale = scale * math.sqrt(lo.fan_in_ref / math.prod(jax_shape[:-1]))
        state[self.spec.field("scales").key] = scale
        return state

    def step_sizes(self, ctx: Context, items, loss_feats: torch.Tensor) -> torch.Tensor:
        """η per item and kind (matrix, vector), times the prior schedule σ: [L, 2]."""
        lo, lr = self.learned_opt, ctx.theta["lr"]
        z = ctx.context_row(lo.timescales, items, loss_feats, lo.use_num_steps)
        return bounded_step_sizes(lr, z, lo.base_lr, lo.log_lr_range) * self.prior_schedule(ctx, items)[:, None]

    def prior_schedule(self, ctx: Context, items) -> torch.Tensor:
        """σ(t, N) per item, [L] (`lopt.torch.rules.schedule.prior_schedule`)."""
        return prior_schedule(self.learned_opt.schedule, ctx, items)

    def updates(self, items, ctx):
        lo, mlp, consts = self.learned_opt, ctx.theta["mlp"], self.spec.constants
        scale_key = self.spec.field("scales").key
        loss_feats = self.loss_features(items, ctx)
        lrs = self.step_sizes(ctx, items, loss_feats)
        bias = mlp["input"]["b"] + ctx.embedding(lo.timescales) @ mlp["input"]["w_time"]
        rest = as_columns([(mlp[f"hidden_{i}"]["w"], mlp[f"hidden_{i}"]["b"])
                           for i in range(1, lo.hidden_layers)] + [(mlp["output"]["w"], mlp["output"]["b"])])
        decays = torch.tensor(lo.decays, dtype=ctx.dtype, device=ctx.device)
        t1 = ctx.steps + 1.0
        bc1 = 1.0 - pow_f32(lo.decays[lo.momentum_index], t1, ctx.dtype)
        bc2 = 1.0 - pow_f32(lo.rms_decay, t1, ctx.dtype)
        for i, it in enumerate(items):
            shape = tuple(it.param.shape)
            if it.param.numel() == 0:
                yield torch.zeros(shape, dtype=ctx.dtype, device=ctx.device)
                continue
            kind = it.state.get("role") or role_of(it.param)
            is_matrix = kind != "vector"
            lr = lrs[i, 0] if is_matrix else lrs[i, 1]
            adam_only = not is_matrix and lo.vector_rule == "adam"
            leaf = FlatLeaf(it, ctx.dtype, self.spec, lo.momentum_index, self.ws)
            sums = leaf.accumulate_and_sum(decays, lo.rms_decay, want_sums=not adam_only)
            m_idx = leaf.m[lo.momentum_index]

            def adam(s, e, out):  # m̂ / (√v̂ + ε_adam), written into out
                torch.div(leaf.v[s:e], bc2[i], out=out).sqrt_().add_(consts["adam_eps"])
                return torch.div(torch.div(m_idx[s:e], bc1[i], out=leaf.scratch("m_hat", 1, s, e)[0]), out, out=out)

            if adam_only:
                u = self.ws.get("update", (leaf.n,), ctx.dtype, ctx.device)
                for s, e in leaf.blocks():
                    adam(s, e, u[s:e])
            else:
                w1t = (mlp["input"]["w"] * torch.rsqrt(sums / leaf.n + consts["eps"])[:, None]).t().contiguous()

                def direction(o, s, e, out):  # a + r (or a + B tanh(r / B))
                    r, bound = o[0], lo.residual_bound
                    if bound == 1.0:  # x / 1 and 1 · x are exact: the shipped optimizers' bound
                        r = r.tanh_()
                    elif bound > 0:
                        r = r.div_(bound).tanh_().mul_(bound)
                    adam(s, e, out).add_(r)

                u = leaf.mlp_map([(w1t, bias[i])] + rest, direction)
                if lo.orthogonalize and kind == "matrix" and len(shape) == 2 and min(shape) > 1:
                    mat = u.view(shape).permute(it.axes)
                    u = newton_schulz(mat, consts).permute(it.axes).reshape(-1)  # a 2-D permutation is its own inverse
                if lo.normalize_update:
                    u = u.div_(torch.sqrt(torch.mean(torch.square(u))) + consts["norm_eps"])
                u = u.clamp_(-lo.clip_value, lo.clip_value)
            u = u.mul_(-(lr * it.state[scale_key]))  # −η ρ u
            yield u.view(shape)

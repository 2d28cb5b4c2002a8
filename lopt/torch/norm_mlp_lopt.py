"""NormMLPLOpt's update in torch (`lopt.norm_mlp_lopt`; the shipped optimizers are NormMLPLOpts).

Per tensor, with MLPLOpt's accumulators and features (`lopt.torch.mlp_lopt`):

    a   = m̂_0.9 / (√v̂ + 1e-8)                       Adam's direction, bias-corrected at t + 1
    r   = MLP(x; b + emb(t) W_time)                  the learned residual (x RMS-normalised)
    u   = a + r    (or a + B tanh(r / B) with `residual_bound` B)
    u   ← NS(u)    with `orthogonalize`, 2-D tensors (both sides > 1), in JAX layout
    u   ← clip(u / (rms(u) + 1e-8), −c, c)  with `normalize_update`, else clip(u, −c, c)
    Δp  = −η_kind · σ(t, N) · ρ(p) · u              (ndim < 2 with vector_rule "adam": −η · σ · ρ · a)

η = base_lr · exp(log_lr_range · tanh(s)), s from the step-size MLP on [emb(t), progress(t, N),
loss features]; σ the prior schedule ("constant" or warm-up + cosine over N); ρ(p) the step
scale fixed at the state's init (`relative_step`: max(rms(p₀), floor), times √(fan_in_ref / fan_in)
with fan_in = ∏ of the JAX-layout shape but its last axis, the output axis).

Each parameter's role (`lopt.param_roles`) is its group's `role` option: by default "matrix" from 2
axes (the fan-in above) and "vector" below; "embedding" (e.g. nn.Embedding.weight) takes ρ without
the fan-in factor; "vector" makes a ≥ 2-D tensor bias-like (η_vector, ρ = 1, no `orthogonalize`).

With `overshoot_gain` κ > 0 the rule carries the overshoot brake (`lopt.torch.overshoot_brake`),
which `TorchLearnedOptimizer.step` applies over all parameters: every Δp scaled by α_t ≤ 1.
"""
from __future__ import annotations

import math

import torch

from lopt.features import WARMUP_FRACTION
from lopt.param_roles import KINDS
from lopt.torch import common
from lopt.torch.mlp_lopt import FlatLeaf, mlp_state
from lopt.torch.overshoot_brake import OvershootBrake
from lopt.torch.rule import Context, Rule, register

__all__ = ["NormMLPLOptRule", "newton_schulz", "NS_COEFFS", "NS_STEPS"]

# optax.contrib.scale_by_muon's defaults, which NormMLPLOpt's `orthogonalize` uses
NS_COEFFS = (3.4445, -4.7750, 2.0315)
NS_STEPS = 5


def newton_schulz(x: torch.Tensor) -> torch.Tensor:
    """optax's `orthogonalize_via_newton_schulz` of a matrix (Frobenius preconditioning, 5 quintic
    steps, the wide orientation): x / (‖x‖_F + 1e-8), then x ← a x + (b A + c A²) x with A = x xᵀ.

    Args:
      x: [rows, cols], in the JAX layout (reduction axis first).

    Returns:
      The orthogonalized matrix, same shape.
    """
    transposed = x.shape[0] > x.shape[1]
    if transposed:
        x = x.t()
    x = x / (torch.linalg.vector_norm(x) + 1e-8)
    a_, b_, c_ = (torch.tensor(c, dtype=torch.float32).to(x.dtype).item() for c in NS_COEFFS)
    for _ in range(NS_STEPS):
        a = x @ x.t()
        b = b_ * a + c_ * (a @ a)
        x = a_ * x + b @ x
    return x.t() if transposed else x


def prior_schedule(name: str, ctx: Context, items) -> torch.Tensor:
    """σ(t, N) per item, [L], as `lopt.features.prior_schedule`: 1 ("constant" or N None), else
    warm-up · ½(1 + cos(π min(t/N, 1)))."""
    ones = torch.ones_like(ctx.steps)
    if name == "constant" or all(it.horizon is None for it in items):
        return ones
    n, known = item_horizons(ctx, items)
    t = ctx.steps
    warm = torch.clamp((t + 1.0) / torch.clamp(torch.ceil(WARMUP_FRACTION * n), min=1.0), max=1.0)
    sched = warm * 0.5 * (1.0 + torch.cos(math.pi * torch.clamp(t / n, max=1.0)))
    return torch.where(known, sched, ones)


def item_horizons(ctx: Context, items) -> tuple[torch.Tensor, torch.Tensor]:
    """Each item's horizon N as a float ≥ 1 ([L]; 1 where unknown) and whether it is known ([L] bool)."""
    n = torch.tensor([float(it.horizon or 1) for it in items], dtype=ctx.dtype, device=ctx.device).clamp(min=1.0)
    return n, torch.tensor([it.horizon is not None for it in items], device=ctx.device)


def role_of(param: torch.Tensor, role=None) -> str:
    """A parameter's role kind (`lopt.param_roles.KINDS`): the group's `role` option, or by default
    "vector" below 2 axes and "matrix" (fan_in from the JAX-layout axes but the last) from 2.

    Raises:
      ValueError: an unknown role, or "matrix" / "embedding" for a tensor of fewer than 2 axes.
    """
    if role is None:
        return "vector" if param.ndim < 2 else "matrix"
    if role not in KINDS:
        raise ValueError(f"unknown parameter role {role!r}: use one of {KINDS} (lopt.param_roles) or None")
    if role != "vector" and param.ndim < 2:
        raise ValueError(f"a parameter of shape {tuple(param.shape)} cannot have the role {role!r} (fewer than 2 axes)")
    return role


@register("NormMLPLOpt")
class NormMLPLOptRule(Rule):
    """`lopt.NormMLPLOpt`'s update (the math is in the module docstring).

    Args:
      learned_opt: the `lopt.NormMLPLOpt`.
      theta: its meta-parameters (numpy arrays).
    """

    reads_loss = True
    reads_roles = True

    def __init__(self, learned_opt, theta):
        super().__init__(learned_opt, theta)
        if learned_opt.overshoot_gain > 0:
            self.brake = OvershootBrake(learned_opt.overshoot_gain, learned_opt.overshoot_threshold)

    def init_state(self, param, axes, dtype, role=None):
        lo = self.learned_opt
        kind = role_of(param, role)
        state = mlp_state(param, len(lo.decays), dtype)
        if self.brake is not None:
            state.update(self.brake.init_param_state(param))
        state["loss_state"] = torch.zeros((2,), dtype=dtype, device=param.device)
        state["role"] = kind
        scale = torch.ones((), dtype=dtype, device=param.device)
        if lo.relative_step and kind != "vector" and param.numel() > 0:
            p = param.detach().to(dtype)
            scale = torch.clamp(torch.sqrt(torch.mean(torch.square(p))), min=lo.relative_floor)
            if lo.fan_in_ref > 0 and kind == "matrix":
                jax_shape = [param.shape[a] for a in axes]
                scale = scale * math.sqrt(lo.fan_in_ref / math.prod(jax_shape[:-1]))
        state["scale"] = scale
        return state

    def step_sizes(self, ctx: Context, items, loss_feats: torch.Tensor) -> torch.Tensor:
        """η per item and kind (matrix, vector), times the prior schedule σ: [L, 2]."""
        lo, lr = self.learned_opt, ctx.theta["lr"]
        z = torch.cat([ctx.embedding(lo.timescales), ctx.progress(items, lo.use_num_steps), loss_feats], dim=1)
        h = torch.relu(z @ lr["hidden"]["w"] + lr["hidden"]["b"])
        s = h @ lr["output"]["w"] + lr["output"]["b"]
        lrs = lo.base_lr * torch.exp(lo.log_lr_range * torch.tanh(s))
        return lrs * self.prior_schedule(ctx, items)[:, None]

    def prior_schedule(self, ctx: Context, items) -> torch.Tensor:
        """σ(t, N) per item, [L] (`prior_schedule`)."""
        return prior_schedule(self.learned_opt.schedule, ctx, items)

    def updates(self, items, ctx):
        lo, mlp = self.learned_opt, ctx.theta["mlp"]
        loss_feats = self.loss_features(items, ctx)
        lrs = self.step_sizes(ctx, items, loss_feats)
        bias = mlp["input"]["b"] + ctx.embedding(lo.timescales) @ mlp["input"]["w_time"]
        rest = common.as_columns([(mlp[f"hidden_{i}"]["w"], mlp[f"hidden_{i}"]["b"])
                                  for i in range(1, lo.hidden_layers)] + [(mlp["output"]["w"], mlp["output"]["b"])])
        decays = torch.tensor(lo.decays, dtype=ctx.dtype, device=ctx.device)
        t1 = ctx.steps + 1.0
        bc1 = 1.0 - common.pow_f32(lo.decays[lo._mom_idx], t1, ctx.dtype)
        bc2 = 1.0 - common.pow_f32(lo.rms_decay, t1, ctx.dtype)
        for i, it in enumerate(items):
            shape = tuple(it.param.shape)
            if it.param.numel() == 0:
                yield torch.zeros(shape, dtype=ctx.dtype, device=ctx.device)
                continue
            kind = it.state.get("role") or role_of(it.param)
            is_matrix = kind != "vector"
            lr = lrs[i, 0] if is_matrix else lrs[i, 1]
            adam_only = not is_matrix and lo.vector_rule == "adam"
            leaf = FlatLeaf(it, ctx.dtype, lo._mom_idx, self.ws)
            sums = leaf.accumulate_and_sum(decays, lo.rms_decay, want_sums=not adam_only)
            m_idx = leaf.m[lo._mom_idx]

            def adam(s, e, out):  # m̂ / (√v̂ + 1e-8), written into out
                torch.div(leaf.v[s:e], bc2[i], out=out).sqrt_().add_(1e-8)
                return torch.div(torch.div(m_idx[s:e], bc1[i], out=leaf.scratch("m_hat", 1, s, e)[0]), out, out=out)

            if adam_only:
                u = self.ws.get("update", (leaf.n,), ctx.dtype, ctx.device)
                for s, e in leaf.blocks():
                    adam(s, e, u[s:e])
            else:
                w1t = (mlp["input"]["w"] * torch.rsqrt(sums / leaf.n + common.EPS)[:, None]).t().contiguous()

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
                    u = newton_schulz(mat).permute(it.axes).reshape(-1)  # a 2-D permutation is its own inverse
                if lo.normalize_update:
                    u = u.div_(torch.sqrt(torch.mean(torch.square(u))) + 1e-8)
                u = u.clamp_(-lo.clip_value, lo.clip_value)
            u = u.mul_(lr).mul_(it.state["scale"]).neg_()  # −(η · u) · ρ
            yield u.view(shape)

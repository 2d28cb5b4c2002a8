"""Celo's update in torch (`lopt.archs.celo`): a per-parameter MLP over 30 features, scaled by a learned scheduler.

Per parameter, s the scheduler's multiplier of this step (`lopt.torch.parts.learned_scheduler`),
everything computed on the JAX-layout view of the tensor (`Item.axes`), because the factored
second moments reduce over its two largest axes (`lopt.Celo.factored_axes`):

    g ← clip(g, ±grad_clip),  m_k ← β_k m_k + (1 − β_k) g,  v ← β_v v + (1 − β_v) g²
    r_j, c_j (rank ≥ 2) or d_j (below) ← the factored moments of g² + g2_eps
    x = the spec's features (`lopt.archs.celo.feature_names`), each / √(mean x² + norm_eps)
    (d, μ) = MLP(x),   Δp = −s · d · (√(mean p² + scale_eps) · exp(μ · exp_mult)) · step_mult

The momenta and v are kept in the parameter's own (torch) layout, the factored moments in the
JAX layout (the spec's layout, `lopt.torch.parts.spec.param_state`); the constants are the spec's.
"""
from __future__ import annotations

import torch

from lopt.torch.layout import inverse_axes
from lopt.torch.parts import learned_scheduler
from lopt.torch.rule import Rule, register

__all__ = ["CeloRule"]


def _safe_rsqrt(x: torch.Tensor, floor: float) -> torch.Tensor:
    return torch.rsqrt(torch.clamp(x, min=floor))


@register("Celo")
class CeloRule(Rule):
    """`lopt.Celo`'s update (the math is in the module docstring).

    Args:
      learned_opt: the `lopt.Celo`.
      theta: its meta-parameters (numpy arrays).
    """

    reads_loss = True
    requires_horizon = True

    def init_state(self, param, axes, dtype):
        return learned_scheduler.init_state(super().init_state(param, axes, dtype), self.theta["scheduler"])

    def features(self, g, p, m, v, st, ctx) -> dict:
        """The features of one tensor in JAX layout by name (each [*s]); st's factored moments advanced."""
        lo, consts, k = self.learned_opt, self.spec.constants, m.shape[0]
        shape = tuple(g.shape)
        gam = torch.tensor(lo.adafactor_decays, dtype=torch.float32).to(ctx.dtype)
        g2 = g * g + consts["g2_eps"]
        axes = lo.factored_axes(shape)
        if axes is not None:
            b, a = axes
            gam = gam.reshape((-1,) + (1,) * (len(shape) - 1))
            row = gam * st["fac_row"] + (1.0 - gam) * torch.mean(g2, dim=a)
            col = gam * st["fac_col"] + (1.0 - gam) * torch.mean(g2, dim=b)
            st["fac_row"], st["fac_col"] = row, col
            row_b = 1 + (b - 1 if b > a else b)
            row_mean = torch.mean(row, dim=row_b, keepdim=True) + consts["row_eps"]
            row_factor = _safe_rsqrt(row / row_mean, consts["rsqrt_floor"]).unsqueeze(1 + a)
            col_factor = _safe_rsqrt(col, consts["rsqrt_floor"]).unsqueeze(1 + b)
            fac_g = g * row_factor * col_factor
            big_r = row.unsqueeze(1 + a).expand((k,) + shape)
            big_c = col.unsqueeze(1 + b).expand((k,) + shape)
            fac_m = m * row_factor * col_factor
        else:
            gam = gam.reshape((-1,) + (1,) * len(shape))
            full = gam * st["fac_full"] + (1.0 - gam) * g2
            st["fac_full"] = full
            fac_g = g * _safe_rsqrt(full + consts["full_eps"], consts["rsqrt_floor"])
            big_r = big_c = full
            fac_m = m * full ** -0.5
        rho = torch.rsqrt(v + consts["rms_eps"])
        clip = consts["feature_clip"]
        feats = {"g": g, "clip_g": torch.clamp(g, -clip, clip), "p": p, "v": v, "rsqrt_v": rho,
                 "g_over_sqrt_v": g * rho}
        for j in range(k):
            n = j + 1
            feats.update({f"m_{n}": m[j], f"m_{n}_over_sqrt_v": m[j] * rho, f"g_over_sqrt_f_{n}": fac_g[j],
                          f"row_{n}": big_r[j], f"col_{n}": big_c[j],
                          f"rsqrt_row_{n}": torch.rsqrt(big_r[j] + consts["factor_eps"]),
                          f"rsqrt_col_{n}": torch.rsqrt(big_c[j] + consts["factor_eps"]),
                          f"m_{n}_over_sqrt_f_{n}": fac_m[j]})
        return feats

    def updates(self, items, ctx):
        lo, consts, mlp = self.learned_opt, self.spec.constants, ctx.theta["mlp"]
        s = learned_scheduler.multipliers("Celo", items, ctx)
        layers = [mlp["input"]] + [mlp[f"hidden_{i}"] for i in range(1, lo.hidden_layers)]
        w_out, b_out = mlp["output"]["w"][:, :2], mlp["output"]["b"][:2]
        f32 = lambda x: torch.tensor(x, dtype=torch.float32).to(ctx.dtype)
        betas, beta_v = f32(lo.momentum_decays), f32(lo.rms_decay)
        exp_mult, step_mult = f32(lo.exp_mult), f32(lo.step_mult)
        for i, it in enumerate(items):
            axes, st = tuple(it.axes), it.state
            if it.param.numel() == 0:
                yield torch.zeros(it.param.shape, dtype=ctx.dtype, device=ctx.device)
                continue
            g = torch.clamp(it.grad.detach().to(ctx.dtype), -consts["grad_clip"], consts["grad_clip"]).permute(axes)
            p = it.param.detach().to(ctx.dtype).permute(axes)
            bm = betas.reshape((-1,) + (1,) * g.dim())
            m = bm * st["momenta"].permute((0,) + tuple(1 + a for a in axes)) + (1.0 - bm) * g
            v = beta_v * st["rms"].permute(axes) + (1.0 - beta_v) * (g * g)
            inv = inverse_axes(axes)
            st["momenta"] = m.permute((0,) + tuple(1 + a for a in inv)).contiguous()
            st["rms"] = v.permute(inv).contiguous()
            feats = self.features(g, p, m, v, st, ctx)
            x = torch.stack([feats[name].reshape(-1) for name in self.spec.features], dim=1)  # [n, F]
            x = x * torch.rsqrt(consts["norm_eps"] + torch.mean(x * x, dim=0))
            for layer in layers:
                x = torch.relu(x @ layer["w"] + layer["b"])
            out = x @ w_out + b_out
            direction, magnitude = out[:, 0].reshape(g.shape), out[:, 1].reshape(g.shape)
            scale = torch.sqrt(torch.mean(p * p) + consts["scale_eps"])
            step = s[i] * (direction * (scale * torch.exp(magnitude * exp_mult)) * step_mult)
            yield (-step).permute(inv)

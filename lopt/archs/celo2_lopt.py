"""Celo2LOpt: a learned update for weight matrices, orthogonalized as Muon's, and Adam for the rest.

In the style of Celo2 (Moudgil et al. 2026: a normalized learned MLP update, Newton–Schulz
orthogonalized for hidden matrices, AdamW for 1-D and embedding parameters) and μLO (step sizes
that transfer across widths), written for lopt; not a reproduction of either. A fresh theta is
`optax.contrib.muon` (momentum 0.95, Nesterov; NAdam for the other tensors): meta-training
starts from a strong hand-designed optimizer and learns what to change.

Every leaf gets a role from `lopt.param_roles` (inferred from its path and shape, or from
`opt_fn`'s `weight_dimension_numbers`). Per tensor p with gradient g, float32 accumulators:

    m_k ← β_k m_k + (1 − β_k) g        β in `decays` (default 0.5, 0.95, 0.99)
    v   ← β_v v + (1 − β_v) g²          β_v = `rms_decay`

β (without index) is the decay closest to 0.9 (`moment_features.momentum_index`): 0.95 by default.

Matrices (role "matrix": dense, conv, attention projections). A per-parameter ReLU MLP reads the
features of `lopt.parts.moment_features`, each divided by its RMS over the tensor, and its output r is
added to the normalized Nesterov momentum:

    x = [g, p, m_1..m_K, √v, g/√(v+ε), m_β/√(v+ε)] / rms          F = K + 5 features
    b = β m_β / (1 − β^(t+2)) + (1 − β) g / (1 − β^(t+1))         (optax.contrib.muon's Nesterov; t = updates so far)
    u = b / rms(b) + MLP(x)
    Δp = −η_matrix · width_scale(p) · orth(u)

orth is optax's Newton–Schulz orthogonalization over the role's input axes and width_scale(p) =
√max(1, fan_out/fan_in) (`lopt.parts.newton_schulz`), so the step's spectral norm is
η·√max(1, fan_out/fan_in) whatever the theta: the learned part chooses the direction, never the
size. The MLP's output layer starts at `residual_init` × a random init, so a fresh u ≈ b.

Embeddings and vectors (biases, norm scales), and any leaf the user marks so (e.g. an output
layer given the role `param_roles.EMBEDDING`), take AdamW with the same Nesterov momentum (NAdamW,
as `optax.contrib.muon`'s Adam path):

    Δp = −η_adam · (b / (√v̂ + 1e-8) + λ p)       v̂ = v / (1 − β_v^(t+1)); λ = `weight_decay`

(λ also decays matrices, Δp −= η_matrix · λ · p, as `optax.contrib.muon` does.)

Step sizes (learned, bounded). A small MLP reads the tensor-independent context
z = [emb(t) (T), progress(t, N) (3), loss features (2)] (`lopt.parts.features`) and emits s ∈ R²:

    η_matrix = `matrix_lr` · exp(`log_lr_range` · tanh(s_0)),   η_adam = `adam_lr` · exp(`log_lr_range` · tanh(s_1))

Its output layer starts at zero, so a fresh theta steps at exactly `matrix_lr` and `adam_lr`; no
theta moves η by more than a factor e^`log_lr_range` either way.

Deploy rules. Each is a part of `lopt.rules`, with its math in that part's docstring, that reaches
the quantities inside this update through `lopt.rules.per_tensor` (each tensor's step size η, its
decay λ inside the bracket, the learned residual r = MLP(x) before it enters u), whether it is
wrapped around `opt_fn`'s transform (a record's rule chain, `lopt.pretrained.rule_chain`) or held
as the fields below (older configs; `field_rules` builds the same parts from them, applied first):
`schedule` (σ(t, N), `lopt.rules.schedule`), `horizon_reference`/`horizon_power`/`residual_horizon_power`
(h(N) on η, the fade on r: `lopt.rules.horizon`), `depth_reference`/`depth_power` (η_matrix:
`lopt.rules.depth`), `conv_step_scale` (both η in a model with a conv kernel: `lopt.rules.conv_step`),
`wd_*` (the loss-aware decoupled decay η·λ·p, λ learned in theta["weight_decay"]["s"] with
`wd_learned`: `lopt.rules.weight_decay`), `residual_no_growth`/`residual_growth_free` (the growth
limit on r: `lopt.rules.radial`) and `overshoot_gain`/`overshoot_threshold` (every step × α_t ≤ 1,
`lopt.rules.overshoot_brake`, around the transform). Muon's direction b is never changed by a rule.
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from lopt import param_roles
from lopt.base import LearnedOptimizer, added_option, layout_option
from lopt.parts import features as ft
from lopt.parts import tree_checks
from lopt.parts import newton_schulz
from lopt.parts.layout import gathered
from lopt.parts.moment_features import (MomentFeatures, accumulate, accumulator_fields, feature_names,
                                        init_accumulators, normalized_feature_mlp)
from lopt.parts.newton_schulz import is_orthogonalized, orthogonalize, width_scale
from lopt.parts.nn import later_layers, residual_mlp_init
from lopt.parts.spec import ArchSpec, iteration_field
from lopt.parts.step_size import LearnedStepSizes, step_size_head_init
from lopt.rules import conv_step, depth, horizon, overshoot_brake, per_tensor, radial, schedule, weight_decay as wd_rule
from lopt.rules.scaled import StepScaleRule

DECAYS = (0.5, 0.95, 0.99)
# elements per block of the per-parameter MLP with the CPU layout: a block's features and hidden units stay in cache
BLOCK = 16384


class Celo2LOptState(NamedTuple):
    """Celo2LOpt's optimizer state.

    Attributes:
      momenta: per leaf, float32 [K, *p.shape]: the momenta m_k.
      second_moment: per leaf, float32 [*p.shape]: v.
      iteration: int32 []: the number of updates so far.
      loss_state: float32 [2]: the loss EMA state of `features.loss_features`.
      loss_start: with `wd_loss_power` > 0, float32 []: the first loss given (`weight_decay.track_loss_start`);
        None otherwise.
    """
    momenta: Any
    second_moment: Any
    iteration: jax.Array
    loss_state: jax.Array
    loss_start: Any = None


class Celo2LOpt(MomentFeatures, LearnedStepSizes, LearnedOptimizer):
    """Learned, Muon-orthogonalized matrix updates and AdamW for the other tensors.

    The math is in the module docstring. Theta: {"mlp": {"input": {"w" [F, H], "b" [H]},
    "hidden_i": {"w" [H, H], "b" [H]} for i in 1..hidden_layers-1, "output": {"w" [H, 1], "b" [1]}},
    "lr": {"hidden": {"w" [C, L], "b" [L]}, "output": {"w" [L, 2], "b" [2]}}} with F = len(decays) + 5,
    C = len(timescales) + 5 and L = `lr_hidden_size`; with `wd_learned`, also {"weight_decay": {"s" []}}.

    Args:
      hidden_size: H, the width of the per-parameter MLP's hidden layers.
      hidden_layers: the number of its hidden ReLU layers (≥ 1).
      decays: the momentum decays β_k; the one closest to 0.9 is Muon's and Adam's momentum.
      rms_decay: β_v of the second moment v (Adam's β₂).
      matrix_lr: η_matrix of a fresh theta (Muon's learning rate).
      adam_lr: η_adam of a fresh theta.
      log_lr_range: the bound of the learned log step sizes around log(matrix_lr), log(adam_lr) (> 0).
      residual_init: the scale of the per-parameter MLP's initial output layer.
      weight_decay: λ ≥ 0, decoupled weight decay of every tensor, times its step size.
      lr_hidden_size: L, the hidden width of the step-size MLP.
      timescales: τ of the step embedding tanh(t/τ − 1).
      use_num_steps: feed the progress features (min(t/N, 1), log1p(N)/10, 1) to the step-size
        MLP; N is `opt_fn`'s `num_steps` (zeros when it is None).
      overshoot_gain: κ ≥ 0 of the overshoot brake (`lopt.rules.overshoot_brake`; 0: off).
      overshoot_threshold: the brake's threshold in [0, 1).
      schedule: the prior schedule σ(t, N) both step sizes multiply (`lopt.rules.schedule`):
        "constant" or "cosine" (5% linear warm-up, cosine decay to 0 at the horizon N; 1 when N is None).
      horizon_reference: N_ref of the horizon factor min(1, N_ref/N)^`horizon_power` both step sizes
        multiply (`lopt.rules.horizon`): 1 up to N_ref, smaller on longer runs (0: off).
      horizon_power: its α ≥ 0.
      residual_horizon_power: β ≥ 0: the learned residual of the matrix direction times
        min(1, N_ref/N)^β (0: unscaled; no effect without `horizon_reference`).
      depth_reference: D_ref of the depth factor min(1, D_ref/D)^`depth_power` the matrix step
        size multiplies, D the number of orthogonalized tensors the optimizer updates
        (`lopt.rules.depth.matrix_depth`): 1 up to D_ref matrices, smaller in deeper models (0: off).
      depth_power: its γ ≥ 0.
      conv_step_scale: c > 0, the factor on both step sizes in a model with a conv kernel
        (`lopt.param_roles`: a role with spatial axes), on every tensor of it; 1: none.
      wd_rate: λ₀ ≥ 0 of the weight-decay rule (`lopt.rules.weight_decay`; 0: off), on top of `weight_decay`.
      wd_learned: λ = λ₀ · exp(R · tanh(s)) with s a meta-parameter (0 in a fresh theta) instead of λ₀.
      wd_log_range: R > 0, the bound of the learned log(λ / λ₀).
      wd_roles: the role kinds the rule decays (`lopt.param_roles.KINDS`; default matrices only).
      wd_loss_power: p ≥ 0 of the rule's loss-aware factor clip((ℓ_0 / (ρ_free · ℓ̄_t))^p, 1, `wd_loss_max`)
        on λ (0: off).
      wd_loss_max: its largest value, ≥ 1.
      wd_loss_free: ρ_free > 0, the fall of the training loss the factor leaves at 1.
      wd_conv_loss_free: conv kernels' ρ_free (`weight_decay.loss_free_of`); 0: `wd_loss_free`.
      residual_no_growth: remove from the learned residual its component that grows each matrix's
        norm (`lopt.rules.radial.remove_growth`); the direction b and the step size are unchanged.
      residual_growth_free: g ≥ 0: with `residual_no_growth`, only in matrices past rms(p) · √fan_in = g
        (LeCun's initial scale is 1; 0: in all).
      layout: the update layout, "cpu" or "accelerator" (`lopt.base.layout_option`; speed only).
    """

    hidden_size: int = 8
    hidden_layers: int = 2
    decays: tuple[float, ...] = DECAYS
    rms_decay: float = 0.999
    matrix_lr: float = 0.02
    adam_lr: float = 3e-3
    log_lr_range: float = 3.0
    residual_init: float = 0.1
    weight_decay: float = 0.0
    lr_hidden_size: int = 16
    timescales: tuple[float, ...] = ft.TIMESCALES
    use_num_steps: bool = True
    overshoot_gain: float = 0.0
    overshoot_threshold: float = 0.15
    schedule: str = added_option("constant")
    horizon_reference: int = added_option(0)
    horizon_power: float = added_option(0.5)
    residual_horizon_power: float = added_option(0.0)
    depth_reference: int = added_option(0)
    depth_power: float = added_option(1.0)
    conv_step_scale: float = added_option(1.0)
    wd_rate: float = added_option(0.0)
    wd_learned: bool = added_option(False)
    wd_log_range: float = added_option(3.0)
    wd_roles: tuple[str, ...] = added_option(wd_rule.DEFAULT_ROLES)
    wd_loss_power: float = added_option(0.0)
    wd_loss_max: float = added_option(10.0)
    wd_loss_free: float = added_option(1.0)
    wd_conv_loss_free: float = added_option(0.0)
    residual_no_growth: bool = added_option(False)
    residual_growth_free: float = added_option(0.0)
    layout: Any = layout_option()

    def check_config(self) -> None:
        if self.hidden_layers < 1 or self.hidden_size < 1 or self.lr_hidden_size < 1:
            raise ValueError(f"Celo2LOpt needs hidden_layers, hidden_size, lr_hidden_size >= 1, got "
                             f"{self.hidden_layers}, {self.hidden_size}, {self.lr_hidden_size}")
        if not self.decays or not all(0.0 <= d < 1.0 for d in (*self.decays, self.rms_decay)):
            raise ValueError(f"Celo2LOpt needs decays and rms_decay in [0, 1), got {self.decays}, {self.rms_decay}")
        if not (self.matrix_lr > 0 and self.adam_lr > 0 and self.log_lr_range > 0):
            raise ValueError(f"matrix_lr, adam_lr and log_lr_range must be > 0, got {self.matrix_lr}, "
                             f"{self.adam_lr}, {self.log_lr_range}")
        if not self.weight_decay >= 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")
        overshoot_brake.check_options(self.overshoot_gain, self.overshoot_threshold)
        horizon.check_horizon_options(self.horizon_reference, horizon_power=self.horizon_power,
                                      residual_horizon_power=self.residual_horizon_power)
        depth.check_depth_options(self.depth_reference, self.depth_power)
        conv_step.check_conv_step_scale(self.conv_step_scale)
        schedule.check_schedule(self.schedule)
        wd_rule.check_weight_decay_options(self.wd_rate, self.wd_learned, self.wd_log_range, self.wd_roles)
        wd_rule.check_loss_options(self.wd_rate, self.wd_loss_power, self.wd_loss_max, self.wd_loss_free,
                                   self.wd_conv_loss_free)
        if not self.residual_growth_free >= 0:
            raise ValueError(f"residual_growth_free must be >= 0, got {self.residual_growth_free}")
        if self.residual_growth_free > 0 and not self.residual_no_growth:
            raise ValueError("residual_growth_free needs residual_no_growth=True (it sets where that rule acts)")

    @property
    def base_step_sizes(self) -> jax.Array:
        """(η_matrix, η_adam) of a fresh theta: float32 [2] = (`matrix_lr`, `adam_lr`)."""
        return jnp.asarray([self.matrix_lr, self.adam_lr], jnp.float32)

    def depth_scale(self, num_matrices: int) -> float:
        """The matrix step size's depth factor min(1, D_ref/D)^γ, a Python float in (0, 1] (`lopt.rules.depth`;
        1 when `depth_reference` is 0), D = `num_matrices` (`depth.matrix_depth`, a static int)."""
        return depth.depth_scale(num_matrices, self.depth_reference, self.depth_power)

    def model_scale(self, roles) -> float:
        """The factor both step sizes multiply for a whole model, a Python float: `conv_step_scale` when one of
        its parameters' `roles` (static `lopt.param_roles.ParamRole`s) is a conv kernel, else 1 (`conv_step.model_scale`)."""
        return conv_step.model_scale(roles, self.conv_step_scale)

    def spec(self) -> ArchSpec:
        """Its features, constants and state layout (`lopt.parts.spec`; read by `lopt.torch` too).

        Returns:
          features `moment_features.feature_names(K)`; constants "eps" (`features.EPS`),
          "adam_eps" (`features.ADAM_EPS`, NAdamW's ε), "norm_eps" (`features.NORM_EPS`, b / (rms(b) + ε))
          and `newton_schulz.constants()`; state "momenta", "second_moment", "iteration",
          "loss_state", with `wd_loss_power` "loss_start" and, with `overshoot_gain`, the brake's
          "prev_update" and "log_brake".
        """
        constants = {"eps": ft.EPS, "adam_eps": ft.ADAM_EPS, "norm_eps": ft.NORM_EPS, **newton_schulz.constants()}
        state = accumulator_fields(len(self.decays)) + (iteration_field(), ft.loss_state_field())
        if self.wd_loss_power > 0:
            state += (wd_rule.loss_start_field(),)
        if self.overshoot_gain > 0:
            state += overshoot_brake.state_fields()
        return ArchSpec("Celo2LOpt", feature_names(len(self.decays)), constants, state)

    def init(self, key: jax.Array) -> dict:
        """Initial theta: Muon on matrices, Adam on the rest, plus a small random residual.

        Args:
          key: PRNG key.

        Returns:
          theta (see the class docstring); the step-size head's output layer is zero, and so is a learned
          weight decay's s (λ = `wd_rate`).
        """
        k_in, k_hidden, k_out, k_lr = jax.random.split(key, 4)
        mlp = residual_mlp_init((k_in, k_hidden, k_out), self.num_features, self.hidden_size, self.hidden_layers, self.residual_init)
        theta = {"mlp": mlp, "lr": step_size_head_init(k_lr, self.num_context, self.lr_hidden_size, 2)}
        if self.wd_learned:
            theta[wd_rule.THETA_KEY] = wd_rule.theta_init()
        return theta

    def field_rules(self, theta: dict, iteration: jax.Array, num_steps: Optional[Any], roles: list, shapes: list,
                    loss_start: Optional[jax.Array], loss_ema: jax.Array) -> tuple:
        """The rules this config holds as fields, as the `lopt.rules.per_tensor.TensorRule`s of the parts
        `lopt.pretrained.rule_chain.from_fields` translates them to (σ, h and the fade, d, c, λ, the growth
        limit), innermost first; a field at its default gives none (module docstring).

        Args:
          theta: meta-parameters (a learned λ); iteration: t, int32 []; num_steps: N (may be traced) or None.
          roles, shapes: every tensor's `lopt.param_roles.ParamRole` and static shape.
          loss_start: ℓ_0 where `wd_loss_power` > 0, else None; loss_ema: float32 [] ℓ̄_t.

        Returns:
          a tuple of TensorRules, evaluated while the update is traced.
        """
        rules = []
        if self.schedule != "constant":
            sigma = schedule.prior_schedule(self.schedule, iteration, num_steps)
            rules.append(StepScaleRule(lambda role, shape: sigma))
        if self.horizon_reference > 0:
            h = horizon.horizon_scale(num_steps, self.horizon_reference, self.horizon_power)
            fade = None
            if self.residual_horizon_power > 0:
                fade = horizon.horizon_scale(num_steps, self.horizon_reference, self.residual_horizon_power)
            rules.append(StepScaleRule(lambda role, shape: h, fade))
        if self.depth_reference > 0:
            d = self.depth_scale(depth.matrix_depth(shapes, roles))
            rules.append(StepScaleRule(lambda role, shape: d if is_orthogonalized(role, shape) else None))
        c = self.model_scale(roles)
        if c != 1.0:
            rules.append(StepScaleRule(lambda role, shape: c))
        lam0 = wd_rule.decay_rate(theta, self.wd_rate, self.wd_learned, self.wd_log_range)
        if lam0 is not None:
            rules.append(wd_rule.LossAwareRule(lam0, loss_start, loss_ema, self.wd_loss_power, self.wd_loss_max,
                                               self.wd_loss_free, self.wd_conv_loss_free, self.wd_roles))
        if self.residual_no_growth:
            rules.append(radial.GrowthLimitRule(self.residual_growth_free))
        return tuple(rules)

    def opt_fn(self, theta: dict, *, num_steps: Optional[Any] = None, is_training: bool = False,
               weight_dimension_numbers: Any = None, strict_roles: bool = False) -> optax.GradientTransformationExtraArgs:
        """The optimizer theta defines (the update is in the module docstring).

        Args:
          theta: meta-parameters, as from `init`.
          num_steps: the horizon N of the progress features (may be traced; None: unknown).
          is_training: accepted for the `LearnedOptimizer` interface and ignored.
          weight_dimension_numbers: parameters' roles and input axes where inference should not
            decide (`lopt.param_roles.infer`): a pytree (or prefix) of `param_roles.ParamRole` /
            `optax.contrib.MuonDimensionNumbers` / None, or a callable (path, shape) -> one of them.
            A leaf given `param_roles.EMBEDDING` or `VECTOR` takes the AdamW path.
          strict_roles: raise on a leaf whose input axes inference cannot read, instead of warning.

        Returns:
          A `lopt.rules.per_tensor.PerTensorTransform` (an `optax.GradientTransformationExtraArgs`); its
          update reads `params`, optionally `loss`, and `tensor_rules=` from the rules wrapped around it:
          their decay rates join λ in each bracket (times that tensor's η) and their residual maps act
          on MLP(x) after the fade.
        """
        del is_training
        self.check_theta(theta, "Celo2LOpt.opt_fn")
        decays = jnp.asarray(self.decays, jnp.float32)
        mlp, idx, beta = theta["mlp"], self.momentum_index, self.decays[self.momentum_index]
        first, rest = (mlp["input"]["w"], mlp["input"]["b"]), later_layers(mlp, self.hidden_layers)
        layout, consts = self.update_layout, self.spec().constants

        def init_fn(params):
            momenta, second = init_accumulators(params, len(self.decays))
            start = jnp.zeros((), jnp.float32) if self.wd_loss_power > 0 else None
            return Celo2LOptState(momenta, second, jnp.zeros((), jnp.int32), ft.init_loss_state(), start)

        def update_leaf(g, p, m, v, role, t, lrs, rules, scales):
            shape, k = jnp.shape(p), len(self.decays)
            n = math.prod(shape)
            if n == 0:
                return jnp.zeros_like(p), m, v
            g32, p32 = jnp.asarray(g, jnp.float32), jnp.asarray(p, jnp.float32)
            decay = self.weight_decay
            for rule in rules:  # the decay rates of the rules (its own, then those outside), innermost first
                rule_lam = rule.decay(role)
                decay = decay if rule_lam is None else decay + rule_lam
            m, v = accumulate(g32, m, v, decays, self.rms_decay)
            t1 = (t + 1).astype(jnp.float32)
            nesterov = beta * m[idx] / (1.0 - beta ** (t1 + 1.0)) + (1.0 - beta) * g32 / (1.0 - beta ** t1)
            ortho = is_orthogonalized(role, shape)
            lr = lrs[0] if ortho else lrs[1]
            for f in scales:  # step-size factors of the rules that vary within a path
                lr = lr * f
            if ortho:
                # flat [n] (the layout's blocks), or in the tensor's own shape where the layout keeps it (sharded)
                flat = (lambda x, *lead: x) if layout.keeps_shape(g) else (lambda x, *lead: x.reshape(*lead, n))
                u = flat(nesterov / (ft.rms(nesterov) + consts["norm_eps"]))
                r = normalized_feature_mlp(flat(g32), flat(p32), flat(m, k), flat(v), idx, first, rest, BLOCK, layout)
                for rule in rules:  # the horizon fade, the growth limit, ..., innermost first
                    r = rule.residual(r, flat(p32), role, shape)
                u = u + r
                orth = gathered(lambda x: orthogonalize(x, role), u.reshape(shape))
                step = lr * (width_scale(shape, role) * orth + decay * p32)
            else:
                v_hat = v / (1.0 - self.rms_decay ** t1)
                step = lr * (nesterov / (jnp.sqrt(v_hat) + consts["adam_eps"]) + decay * p32)
            return (-step).astype(jnp.result_type(p)), m, v

        def update_fn(updates, state, params=None, **extra_args):
            tree_checks.require_params(updates, params, "Celo2LOpt")
            loss_feats, loss_state = ft.loss_features(extra_args.get("loss"), state.loss_state)
            t = state.iteration
            roles = param_roles.infer(params, weight_dimension_numbers, strict=strict_roles)
            treedef, gs, (ps, ms, vs, rs) = tree_checks.leaves_of(updates, params, state.momenta, state.second_moment, roles)
            shapes = [tuple(jnp.shape(p)) for p in ps]
            start = None
            if self.wd_loss_power > 0:
                start = wd_rule.track_loss_start(state.loss_start, state.loss_state, extra_args.get("loss"))
            rules = self.field_rules(theta, t, num_steps, rs, shapes, start, loss_state[0]) + per_tensor.innermost_first(
                extra_args)
            lrs, scales = per_tensor.scale_step_sizes(self.step_sizes(theta, t, num_steps, loss_feats), rules, rs, shapes,
                                                      [0 if is_orthogonalized(r, s) else 1 for r, s in zip(rs, shapes)])
            leaves = [update_leaf(g, p, m, v, r, t, lrs, rules, sc) for g, p, m, v, r, sc in zip(gs, ps, ms, vs, rs, scales)]
            new_updates, momenta, second = (treedef.unflatten(x) for x in zip(*leaves)) if leaves else (updates,) * 3
            return new_updates, Celo2LOptState(momenta, second, t + 1, loss_state, start)

        tx = per_tensor.PerTensorTransform(init_fn, update_fn)
        if self.overshoot_gain > 0:
            tx = overshoot_brake.overshoot_brake(tx, self.overshoot_gain, self.overshoot_threshold)
        return tx

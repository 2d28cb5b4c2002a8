"""NormMLPLOpt: a normalized per-parameter MLP update with a learned, bounded step size.

In the style of Celo (a learned global step size through an exponential, read from task-agnostic
features) and Celo2 (a normalized MLP update rule, optionally orthogonalized), written for lopt;
not a reproduction of either. Per parameter tensor p with gradient g, float32 accumulators:

    m_k ← β_k m_k + (1 − β_k) g        β in `decays` (default 0.5, 0.9, 0.99, 0.999)
    v   ← β_v v + (1 − β_v) g²          β_v = `rms_decay`

Direction. The Adam direction a = m̂ / (√v̂ + ε) (m̂, v̂ bias-corrected; m the momentum whose decay
is closest to 0.9) plus a learned residual r from a per-parameter MLP:

    x = [g, p, m_1..m_K, √v, g/√(v+ε), m_0.9/√(v+ε)]   each divided by its RMS over the tensor (F = K + 5)
    r = MLP(x; first-layer bias b + emb(t) W_time)      hidden ReLU layers, one output
    u = a + r                                          (with `residual_bound` B > 0: u = a + B tanh(r / B))

Normalization (Celo2-style). With `orthogonalize`, u of every 2-D tensor (both sides > 1) is
first replaced by its Newton–Schulz orthogonalization (optax's `scale_by_muon`, momentum 0).
Then u is scaled to unit RMS over the tensor and clipped elementwise (with `normalize_update`;
without it, only clipped, so Adam's elementwise magnitudes, small where the gradient is noisy, are kept):

    û = clip(u / (rms(u) + ε), −c, c)       c = `clip_value`      (or clip(u, −c, c))

Step size (Celo-style, learned and bounded). A small MLP reads the tensor-constant context
z = [emb(t) (T), progress(t, N) (3), loss features (2)] and emits s ∈ R², one value for
matrices (ndim ≥ 2) and one for the other tensors; each is squashed, so that

    η_i = exp(log(`base_lr`) + `log_lr_range` · tanh(s_i)) ∈ [base_lr · e^−range, base_lr · e^range]
    Δp  = −η_kind(p) · σ(t, N) · ρ(p) · û

σ is a prior schedule the learned η multiplies: 1 (`schedule="constant"`) or, with
`schedule="cosine"` and a known horizon N, a linear warm-up over the first 5% of N then a cosine
decay to 0 at N (1 when N is None). ρ(p) = 1, or with `relative_step`, for tensors of ndim ≥ 2,
the RMS the tensor had when the optimizer state was initialised, max(rms(p₀), `relative_floor`):
steps relative to each weight matrix's initial scale (μP-style: wider layers, initialised
smaller, take proportionally smaller steps), so one η suits layers and tasks of different
scales, and a reparameterisation p → c·p scales the step with it. The scale is fixed at init:
scaling by the current RMS (LARS-style) lets the weights grow geometrically, and long runs
diverged. Vectors (biases, norm scales; often initialised at 0 or 1) take absolute steps.

With `fan_in_ref` c₀ > 0 (and `relative_step`) the matrix scale is μP's for Adam-type updates,

    ρ(p) = max(rms(p₀), `relative_floor`) · √(c₀ / fan_in(p))      fan_in = ∏ shape[reduction axes]

μP (and μLO, 2024) gives hidden matrices of an Adam-like optimizer a step ∝ 1/fan_in; a standard
init supplies rms(p₀) ∝ 1/√fan_in and this factor the other 1/√fan_in. fan_in comes from each
leaf's role (`lopt.param_roles`: inferred from path and shape, or `opt_fn`'s
`weight_dimension_numbers`): dense [in, out]: in; conv: ∏ spatial · in; attention q/k/v [d_model,
heads, head_dim]: d_model; attention out [heads, head_dim, d_model]: heads · head_dim. Embeddings
(μP: input-like) take max(rms(p₀), floor), no fan-in factor; biases and norm scales (also flax's
[heads, head_dim] attention biases) are vectors: absolute steps, η_vector, `vector_rule`.

The last layers of both MLPs start at zero (the step-size head) or small (the residual,
× `residual_init`), so a fresh theta is normalized Adam at `base_lr`: a small, safe optimizer.
No theta can make an element's step larger than base_lr · e^range · c (times ρ(p)).

With `vector_rule="adam"` (Celo2's deployment: Adam for 1-D parameters), vectors skip the MLP
and the normalization: Δp = −η_vector · a.

With `overshoot_gain` κ > 0 every step is scaled by `lopt.rules.overshoot_brake`'s α_t ≤ 1, which falls
while gradients point back along the last step (an η too large for the task), else returns to 1.

How it is computed: each feature's RMS normalisation is folded into the residual MLP's
first-layer weights, and the MLP runs as unrolled multiply-adds over blocks (`BLOCK` elements with
the CPU layout, `lopt.parts.layout`), so the update never forms an [n, F] feature array or an
[n, H] activation.
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
from lopt.parts.newton_schulz import orthogonalize
from lopt.parts.nn import later_layers, residual_mlp_init
from lopt.parts.spec import PARAM, ArchSpec, StateField, iteration_field
from lopt.parts.step_size import LearnedStepSizes, step_size_head_init
from lopt.rules import overshoot_brake, schedule

DECAYS = (0.5, 0.9, 0.99, 0.999)
VECTOR_RULES = ("learned", "adam")
# elements per block of the residual MLP with the CPU layout: a block's features and hidden units stay in cache, and no
# temporary of the tensor's size exists (XLA on CPU page-faults those in on every call)
BLOCK = 16384


class NormMLPLOptState(NamedTuple):
    """NormMLPLOpt's optimizer state.

    Attributes:
      momenta: per leaf, float32 [K, *p.shape]: the momenta m_k.
      second_moment: per leaf, float32 [*p.shape]: v.
      iteration: int32 []: the number of updates so far.
      loss_state: float32 [2]: the loss EMA state of `features.loss_features`.
      scales: per leaf, float32 []: ρ(p), the step scale fixed at init (1 without `relative_step`).
    """
    momenta: Any
    second_moment: Any
    iteration: jax.Array
    loss_state: jax.Array
    scales: Any


class NormMLPLOpt(MomentFeatures, LearnedStepSizes, LearnedOptimizer):
    """Normalized Adam-plus-learned-residual update with a learned, bounded step size.

    The math is in the module docstring. Theta: {"mlp": {"input": {"w" [F, H], "w_time" [T, H],
    "b" [H]}, "hidden_i": {"w" [H, H], "b" [H]} for i in 1..hidden_layers-1, "output": {"w" [H, 1],
    "b" [1]}}, "lr": {"hidden": {"w" [C, L], "b" [L]}, "output": {"w" [L, 2], "b" [2]}}} with
    F = len(decays) + 5, T = len(timescales), C = T + 5 and L = `lr_hidden_size`.

    Args:
      hidden_size: H, the width of the per-parameter MLP's hidden layers.
      hidden_layers: the number of hidden ReLU layers of the per-parameter MLP (≥ 1).
      decays: the momentum decays β_k (one must be the "0.9" momentum of the Adam direction: the
        closest to 0.9 is used).
      rms_decay: β_v of the second moment v.
      base_lr: the step size of a fresh theta (η at s = 0).
      log_lr_range: the bound of the learned log step size around log(base_lr) (> 0).
      clip_value: c, the elementwise bound of the normalized update û.
      residual_init: the scale of the residual MLP's initial output layer.
      lr_hidden_size: L, the hidden width of the step-size MLP.
      timescales: τ of the step embedding tanh(t/τ − 1).
      use_num_steps: feed the progress features (min(t/N, 1), log1p(N)/10, 1) to the step-size
        MLP; N is `opt_fn`'s `num_steps` (zeros when it is None).
      orthogonalize: Newton–Schulz-orthogonalize the direction of 2-D tensors before normalizing.
      vector_rule: "learned" (every tensor gets the learned rule) or "adam" (tensors of ndim < 2
        take the plain Adam direction at their learned step size).
      normalize_update: scale each tensor's direction to unit RMS before clipping (Celo2-style);
        False keeps the direction's own elementwise magnitudes.
      residual_bound: B > 0 bounds the learned residual to B·tanh(r / B), inside (−B, B), so no theta moves
        the direction far from Adam's; 0 leaves it unbounded.
      schedule: the prior schedule σ(t, N) the learned step size multiplies: "constant" or "cosine"
        (5% linear warm-up, cosine decay to 0 at the horizon N; 1 when N is None).
      relative_step: scale the step of each tensor of ndim ≥ 2 by max(rms(p₀), relative_floor),
        its RMS at the optimizer's init.
      relative_floor: the smallest weight scale a relative step uses (> 0), so a matrix that starts
        at zero still moves.
      fan_in_ref: c₀ ≥ 0; with `relative_step`, multiply each matrix's scale by √(c₀ / fan_in), μP's
        1/fan_in step for Adam-type updates (0: off); fan_in from each leaf's role (`lopt.param_roles`).
      overshoot_gain: κ ≥ 0 of the overshoot brake (`lopt.rules.overshoot_brake`; 0: off). The state is
        then an `overshoot_brake.OvershootBrakeState` around the `NormMLPLOptState`.
      overshoot_threshold: the brake's threshold c₀ in [0, 1) on the cosine of a gradient and the last step.
      layout: the update layout, "cpu" or "accelerator" (`lopt.base.layout_option`; speed only).
    """

    hidden_size: int = 16
    hidden_layers: int = 1
    decays: tuple[float, ...] = DECAYS
    rms_decay: float = 0.999
    base_lr: float = 3e-3
    log_lr_range: float = 5.0
    clip_value: float = 5.0
    residual_init: float = 0.1
    lr_hidden_size: int = 16
    timescales: tuple[float, ...] = ft.TIMESCALES
    use_num_steps: bool = True
    orthogonalize: bool = False
    vector_rule: str = "learned"
    normalize_update: bool = True
    residual_bound: float = 0.0
    schedule: str = "constant"
    relative_step: bool = False
    relative_floor: float = 1e-3
    fan_in_ref: float = added_option(0.0)
    overshoot_gain: float = added_option(0.0)
    overshoot_threshold: float = added_option(0.15)
    layout: Any = layout_option()

    def check_config(self) -> None:
        if self.hidden_layers < 1 or self.hidden_size < 1 or self.lr_hidden_size < 1:
            raise ValueError(f"NormMLPLOpt needs hidden_layers, hidden_size, lr_hidden_size >= 1, got "
                             f"{self.hidden_layers}, {self.hidden_size}, {self.lr_hidden_size}")
        if not self.decays:
            raise ValueError("NormMLPLOpt needs at least one momentum decay")
        if not all(0.0 <= d < 1.0 for d in (*self.decays, self.rms_decay)):
            raise ValueError(f"decays and rms_decay must lie in [0, 1), got {self.decays}, {self.rms_decay}")
        if not (self.base_lr > 0 and self.log_lr_range > 0 and self.clip_value > 0):
            raise ValueError(f"base_lr, log_lr_range and clip_value must be > 0, got {self.base_lr}, "
                             f"{self.log_lr_range}, {self.clip_value}")
        if self.vector_rule not in VECTOR_RULES:
            raise ValueError(f"unknown vector_rule {self.vector_rule!r}; known: {VECTOR_RULES}")
        if self.residual_bound < 0:
            raise ValueError(f"residual_bound must be >= 0 (0: unbounded), got {self.residual_bound}")
        schedule.check_schedule(self.schedule)
        if not self.relative_floor > 0:
            raise ValueError(f"relative_floor must be > 0, got {self.relative_floor}")
        if not self.fan_in_ref >= 0:
            raise ValueError(f"fan_in_ref must be >= 0 (0: off), got {self.fan_in_ref}")
        if self.fan_in_ref > 0 and not self.relative_step:
            raise ValueError("fan_in_ref scales the relative step: it needs relative_step=True")
        overshoot_brake.check_options(self.overshoot_gain, self.overshoot_threshold)

    @property
    def base_step_sizes(self) -> float:
        """η of a fresh theta, for matrices and vectors alike: `base_lr`."""
        return self.base_lr

    def spec(self) -> ArchSpec:
        """Its features, constants and state layout (`lopt.parts.spec`; read by `lopt.torch` too).

        Returns:
          features `moment_features.feature_names(K)`; constants "eps" (`features.EPS`),
          "adam_eps" (`features.ADAM_EPS`, a's ε), "norm_eps" (`features.NORM_EPS`, û's ε) and,
          with `orthogonalize`, `newton_schulz.constants()`; state "momenta", "second_moment",
          "iteration", "loss_state", "scales" (ρ(p), one per leaf; "scale" in torch) and, with
          `overshoot_gain`, the brake's "prev_update" and "log_brake" (`lopt.rules.overshoot_brake`).
        """
        constants = {"eps": ft.EPS, "adam_eps": ft.ADAM_EPS, "norm_eps": ft.NORM_EPS}
        if self.orthogonalize:
            constants.update(newton_schulz.constants())
        state = accumulator_fields(len(self.decays)) + (
            iteration_field(), ft.loss_state_field(),
            StateField("scales", PARAM, shape_of=lambda s: (), fill=1.0, torch_name="scale",
                       doc="ρ(p), fixed at init (1 without relative_step)"))
        if self.overshoot_gain > 0:
            state += overshoot_brake.state_fields()
        return ArchSpec("NormMLPLOpt", feature_names(len(self.decays)), constants, state)

    def init(self, key: jax.Array) -> dict:
        """Initial theta: normalized Adam at `base_lr` plus a small random residual.

        Args:
          key: PRNG key.

        Returns:
          theta (see the class docstring); the step-size head's output layer is zero.
        """
        k_in, k_hidden, k_out, k_lr = jax.random.split(key, 4)
        f = self.num_features
        mlp = residual_mlp_init((k_in, k_hidden, k_out), f + len(self.timescales), self.hidden_size,
                                self.hidden_layers, self.residual_init)
        first = mlp["input"]
        mlp["input"] = {"w": first["w"][:f], "w_time": first["w"][f:], "b": first["b"]}
        return {"mlp": mlp, "lr": step_size_head_init(k_lr, self.num_context, self.lr_hidden_size, 2)}

    def step_scale(self, p: jax.Array, role=None) -> jax.Array:
        """ρ(p) of a tensor at init, with `relative_step`: max(rms(p), relative_floor) for a matrix
        (· √(fan_in_ref / fan_in) with `fan_in_ref`) or an embedding; 1 for a vector, and without
        `relative_step`.

        Args:
          p: a parameter tensor (the value the optimizer state is initialised with).
          role: its `param_roles.ParamRole`; None: inferred from its shape alone (no path), so a
            rank ≥ 3 tensor is read as a conv kernel, with a warning.

        Returns:
          float32 [].
        """
        if role is None:
            role = param_roles.infer(p)
        if not self.relative_step or role.kind == "vector" or jnp.size(p) == 0:
            return jnp.ones((), jnp.float32)
        scale = jnp.maximum(ft.rms(jnp.asarray(p, jnp.float32)), self.relative_floor)
        if self.fan_in_ref > 0 and role.kind == "matrix":
            scale = scale * math.sqrt(self.fan_in_ref / role.fan_in(jnp.shape(p)))
        return scale

    def prior_schedule(self, iteration: jax.Array, num_steps: Optional[Any]) -> jax.Array:
        """σ(t, N), the prior schedule the learned step size multiplies.

        Args:
          iteration: t, int32 [] (the number of updates before this one).
          num_steps: the horizon N (may be traced) or None.

        Returns:
          float32 []: 1 for "constant" or N None; for "cosine", min((t+1)/w, 1) · ½(1 + cos(π·min(t/N, 1)))
          with w = max(1, ⌈0.05 N⌉).
        """
        return schedule.prior_schedule(self.schedule, iteration, num_steps)

    def opt_fn(self, theta: dict, *, num_steps: Optional[Any] = None, is_training: bool = False,
               weight_dimension_numbers: Any = None, strict_roles: bool = False) -> optax.GradientTransformationExtraArgs:
        """The optimizer theta defines (the update is in the module docstring).

        Args:
          theta: meta-parameters, as from `init`.
          num_steps: the horizon N of the progress features and the prior schedule (may be
            traced; None: unknown).
          is_training: accepted for the `LearnedOptimizer` interface and ignored: the update is the
            same while meta-training and after.
          weight_dimension_numbers: parameters' roles and input axes, where inference should not
            decide (`lopt.param_roles.infer`): a pytree (or prefix) of `param_roles.ParamRole` /
            `optax.contrib.MuonDimensionNumbers` / None, or a callable (path, shape) -> one of them.
          strict_roles: raise on a leaf whose input axes inference cannot read, instead of warning.

        Returns:
          An `optax.GradientTransformationExtraArgs`; its update reads `params` and, optionally, `loss`.
        """
        del is_training
        roles_of = lambda params: param_roles.infer(params, weight_dimension_numbers, strict=strict_roles)
        self.check_theta(theta, "NormMLPLOpt.opt_fn")
        decays = jnp.asarray(self.decays, jnp.float32)
        mlp, idx, layout = theta["mlp"], self.momentum_index, self.update_layout
        consts = self.spec().constants

        def init_fn(params):
            if tree_checks.is_abstract(params):  # ρ(p) reads the values: the state's shapes, dtypes and shardings
                return jax.eval_shape(init_fn, params)
            momenta, second = init_accumulators(params, len(self.decays))
            scales = jax.tree_util.tree_map(self.step_scale, params, roles_of(params))
            return NormMLPLOptState(momenta, second, jnp.zeros((), jnp.int32), ft.init_loss_state(), scales)

        rest = later_layers(mlp, self.hidden_layers)

        def residual(g32: jax.Array, p32: jax.Array, m: jax.Array, v: jax.Array, bias: jax.Array) -> jax.Array:
            """The learned residual r [n] of one tensor (g, p, v [n], m [K, n]), its first-layer bias
            carrying the step embedding (`moment_features.normalized_feature_mlp`)."""
            return normalized_feature_mlp(g32, p32, m, v, idx, (mlp["input"]["w"], bias), rest, BLOCK, layout)

        def update_leaf(g, p, m, v, scale, role, t, bias, lrs):
            shape, k = jnp.shape(p), len(self.decays)
            n = math.prod(shape)
            if n == 0:
                return jnp.zeros_like(p), m, v
            # flat [n] (the layout's blocks), or in the tensor's own shape where the layout keeps it (sharded)
            flat = (lambda x, *lead: x) if layout.keeps_shape(g) else (lambda x, *lead: x.reshape(*lead, n))
            g32, p32 = flat(jnp.asarray(g, jnp.float32)), flat(jnp.asarray(p, jnp.float32))
            # in the tensor's own shape (see `accumulate`), then flat
            m, v = accumulate(jnp.asarray(g, jnp.float32), m, v, decays, self.rms_decay)
            m, v = flat(m, k), flat(v)
            t1 = (t + 1).astype(jnp.float32)
            m_hat = m[idx] / (1.0 - self.decays[idx] ** t1)
            v_hat = v / (1.0 - self.rms_decay ** t1)
            adam = m_hat / (jnp.sqrt(v_hat) + consts["adam_eps"])
            is_matrix = role.kind != "vector"
            lr = lrs[0] if is_matrix else lrs[1]
            if not is_matrix and self.vector_rule == "adam":
                step = lr * adam
            else:
                r = residual(g32, p32, m, v, bias)
                if self.residual_bound > 0:
                    r = self.residual_bound * jnp.tanh(r / self.residual_bound)
                u = adam + r
                if self.orthogonalize and role.kind == "matrix" and len(shape) == 2 and min(shape) > 1:
                    u = flat(gathered(lambda x: orthogonalize(x, param_roles.MATRIX), u.reshape(shape)))
                if self.normalize_update:
                    u = u / (ft.rms(u) + consts["norm_eps"])
                u = jnp.clip(u, -self.clip_value, self.clip_value)
                step = lr * u
            step = step * scale
            return ((-step).reshape(shape).astype(jnp.result_type(p)), m.reshape((k,) + shape), v.reshape(shape))

        def update_fn(updates, state, params=None, **extra_args):
            tree_checks.require_params(updates, params, "NormMLPLOpt")
            loss_feats, loss_state = ft.loss_features(extra_args.get("loss"), state.loss_state)
            t = state.iteration
            lrs = self.step_sizes(theta, t, num_steps, loss_feats) * self.prior_schedule(t, num_steps)
            bias = mlp["input"]["b"] + ft.step_embedding(t, self.timescales) @ mlp["input"]["w_time"]
            treedef, gs, (ps, ms, vs, ss, rs) = tree_checks.leaves_of(updates, params, state.momenta, state.second_moment,
                                                             state.scales, roles_of(params))
            leaves = [update_leaf(g, p, m, v, sc, r, t, bias, lrs) for g, p, m, v, sc, r in zip(gs, ps, ms, vs, ss, rs)]
            new_updates, momenta, second = (treedef.unflatten(x) for x in zip(*leaves)) if leaves else (updates,) * 3
            return new_updates, NormMLPLOptState(momenta, second, t + 1, loss_state, state.scales)

        tx = optax.GradientTransformationExtraArgs(init_fn, update_fn)
        if self.overshoot_gain > 0:
            tx = overshoot_brake.overshoot_brake(tx, self.overshoot_gain, self.overshoot_threshold)
        return tx

"""The weight-decay rule: decoupled weight decay added to a learned update, at a fixed or learned rate.

    Δp ← Δp − η(p) · λ · p          for every p whose role's kind is in `roles` (default: "matrix")
    λ  = λ₀                                        fixed (`learned` False)
    λ  = λ₀ · exp(R · tanh(s))                     learned: s = theta["weight_decay"]["s"], float32 [], 0 at init

η(p) is the step size the architecture applies to p's own update in that step: for Celo2LOpt
η_matrix for an orthogonalized matrix and η_adam for a tensor on its NAdamW path, each the
learned step-size head's value times the prior schedule σ(t, N) and the horizon and depth
factors. So the decay is AdamW's (Loshchilov & Hutter 2019), p ← p − η_t (u_t + λ p), with the
learned optimizer's step size in the place of AdamW's scheduled rate: it follows the schedule
and the learned step size, and it is decoupled, in that λ p enters neither the gradient
features, nor the moments, nor the normalisation or orthogonalisation of the direction u_t.
Under an orthogonalized update of spectral norm η·w per step, a decayed matrix's spectral norm
stays below about w / λ (the fixed point of ‖W‖ ← (1 − ηλ)‖W‖ + ηw), whatever the horizon.

As AdamW is used in practice, only weight matrices decay by default: biases, norm scales and
embeddings (`lopt.param_roles` kinds "vector" and "embedding") keep their values unless
`roles` names them. Learned, λ is one meta-parameter, log-parameterised and bounded like the
step sizes (`lopt.parts.step_size`): a fresh s = 0 decays at exactly λ₀, and no theta moves λ
by more than a factor e^R either way. λ₀ = 0 turns the rule off: no term is added, and the
update is bit-identical to the architecture's without the rule.

Loss-aware (`loss_power` p > 0), λ also multiplies the factor

    φ_t = clip((ℓ_0 / (ρ_free · ℓ̄_t))^p, 1, φ_max)

ℓ_0 the first training loss the optimizer was given and ℓ̄_t the running mean of the loss
(`lopt.parts.features.loss_features`' EMA, this step's loss included). A run whose training loss
falls by orders of magnitude is fitting its training set far past what held-out data rewards
(measured: docs/pretrained.md), and decays more, up to φ_max · λ; a run whose loss stays within
ρ_free of its start decays at λ. Conv kernels (roles with spatial axes, `lopt.param_roles`) may take
their own ρ_free (`wd_conv_loss_free`), for convnets whose kernels should decay later than their dense
layers (on the convnets measured it changed little: docs/pretrained.md). The factor is 1 until a loss
is given, and
wherever ℓ_0 or ℓ̄_t is not positive (the ratio of losses then means nothing). It needs the
architecture's state to keep ℓ_0 (`loss_start_field`).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import optax

from lopt.param_roles import KINDS
from lopt.parts import features as ft
from lopt.parts.spec import STEP, StateField
from lopt.rules import per_tensor
from lopt.rules.scaled import known, leaf_roles

__all__ = ["LossAwareRule", "THETA_KEY", "DEFAULT_ROLES", "check_weight_decay_options", "check_loss_options", "theta_init", "decay_rate",
           "is_decayed", "loss_free_of", "loss_start_field", "track_loss_start", "loss_factor", "LossAwareDecayState",
           "loss_aware_decay"]

THETA_KEY = "weight_decay"
DEFAULT_ROLES = ("matrix",)


def check_weight_decay_options(rate: float, learned: bool, log_range: float, roles: Sequence[str]) -> None:
    """Refuses a negative λ₀, a learned λ at λ₀ = 0, a range R ≤ 0 or an unknown role kind.

    Args:
      rate: λ₀ (the option `wd_rate`; 0: off).
      learned: whether λ is learned (`wd_learned`).
      log_range: R (`wd_log_range`).
      roles: the role kinds that decay (`wd_roles`).

    Raises:
      ValueError: naming the options and their values.
    """
    if known(rate) and not rate >= 0:
        raise ValueError(f"wd_rate must be >= 0 (0: no weight-decay rule), got {rate!r}")
    if learned and known(rate) and rate == 0:
        raise ValueError("wd_learned=True needs wd_rate > 0: the learned rate is wd_rate · exp(R · tanh(s))")
    if not log_range > 0:
        raise ValueError(f"wd_log_range must be > 0, got {log_range!r}")
    unknown = [r for r in roles if r not in KINDS]
    if unknown or not roles:
        raise ValueError(f"wd_roles must be a non-empty tuple of role kinds {KINDS}, got {tuple(roles)!r}")


def check_loss_options(rate: float, loss_power: float, loss_max: float, loss_free: float,
                       conv_loss_free: float = 0.0) -> None:
    """Refuses a negative p, φ_max < 1, ρ_free ≤ 0, or a loss-aware factor without a decay to scale.

    Args:
      rate: λ₀ (`wd_rate`).
      loss_power: p (`wd_loss_power`; 0: off).
      loss_max: φ_max (`wd_loss_max`).
      loss_free: ρ_free (`wd_loss_free`).
      conv_loss_free: conv kernels' ρ_free (`wd_conv_loss_free`; 0: `loss_free`), ≥ 0.

    Raises:
      ValueError: naming the options and their values.
    """
    if not conv_loss_free >= 0:
        raise ValueError(f"wd_conv_loss_free must be >= 0 (0: conv kernels take wd_loss_free), got {conv_loss_free!r}")
    if conv_loss_free > 0 and loss_power == 0:
        raise ValueError("wd_conv_loss_free > 0 needs wd_loss_power > 0: it is the loss-aware factor's ratio for "
                         "conv kernels")
    if not loss_power >= 0:
        raise ValueError(f"wd_loss_power must be >= 0 (0: no loss-aware factor), got {loss_power!r}")
    if known(loss_max) and not loss_max >= 1:
        raise ValueError(f"wd_loss_max must be >= 1 (the largest factor on wd_rate), got {loss_max!r}")
    if known(loss_free) and not loss_free > 0:
        raise ValueError(f"wd_loss_free must be > 0 (the loss ratio below which the rate stays wd_rate), got {loss_free!r}")
    if loss_power > 0 and known(rate) and rate == 0:
        raise ValueError("wd_loss_power > 0 needs wd_rate > 0: the loss-aware factor multiplies wd_rate")


def theta_init() -> dict:
    """The rule's meta-parameters when λ is learned: {"s": float32 [] = 0} (λ = λ₀ at init)."""
    return {"s": jnp.zeros((), jnp.float32)}


def decay_rate(theta: Any, rate: float, learned: bool, log_range: float) -> Optional[jax.Array]:
    """λ, the decay coefficient of this step (module docstring).

    Args:
      theta: the architecture's theta (read only when `learned`: its `THETA_KEY` entry).
      rate: λ₀ ≥ 0.
      learned: λ = λ₀ · exp(R · tanh(s)) instead of λ₀.
      log_range: R > 0.

    Returns:
      None when λ₀ = 0 (the rule is off: the caller adds nothing); else float32 [] λ.
    """
    if rate == 0:
        return None
    if not learned:
        return jnp.asarray(rate, jnp.float32)
    s = jnp.asarray(theta[THETA_KEY]["s"], jnp.float32)
    return rate * jnp.exp(log_range * jnp.tanh(s))


def is_decayed(role: Any, roles: Sequence[str]) -> bool:
    """Whether a parameter of `role` (a `lopt.param_roles.ParamRole`) decays: its kind is in `roles`."""
    return role.kind in roles


def loss_free_of(role: Any, loss_free: float, conv_loss_free: float) -> float:
    """The ρ_free a parameter of `role` takes: `conv_loss_free` for a conv kernel when it is set (> 0),
    else `loss_free`."""
    return conv_loss_free if conv_loss_free > 0 and role.is_conv else loss_free


def loss_start_field() -> StateField:
    """The state entry of ℓ_0, the first loss given: "loss_start", float32 [] per step, 0 before it."""
    return StateField("loss_start", STEP, (), doc="the first training loss given (the weight-decay rule's ℓ_0)")


def track_loss_start(loss_start: jax.Array, old_loss_state: jax.Array, loss: Optional[Any]) -> jax.Array:
    """ℓ_0 after this step: kept once a loss was seen, else this step's loss (0 while none is given).

    Args:
      loss_start: float32 [], ℓ_0 before this step.
      old_loss_state: `features.loss_features`' state before this step ([ℓ̄, seen]).
      loss: this step's loss, a scalar, or None.

    Returns:
      float32 [] ℓ_0.
    """
    if loss is None:
        return loss_start
    return jnp.where(old_loss_state[1] > 0, loss_start, jnp.asarray(loss, jnp.float32).reshape(()))


def loss_factor(loss_start: jax.Array, loss_ema: jax.Array, power: float, max_factor: float,
                free: float = 1.0) -> jax.Array:
    """φ = clip((ℓ_0 / (ρ_free · ℓ̄))^p, 1, φ_max), 1 where ℓ_0 ≤ 0 or ℓ̄ ≤ 0 (module docstring).

    Args:
      loss_start: float32 [] ℓ_0 (`track_loss_start`).
      loss_ema: float32 [] ℓ̄, this step's loss EMA.
      power: p > 0.
      max_factor: φ_max ≥ 1.
      free: ρ_free > 0.

    Returns:
      float32 [] φ in [1, φ_max].
    """
    valid = (loss_start > 0) & (loss_ema > 0)
    ratio = jnp.where(valid, loss_start / jnp.where(valid, loss_ema, 1.0), 1.0)
    return jnp.clip((ratio / free) ** power, 1.0, max_factor)


@flax.struct.dataclass
class LossAwareDecayState:
    """`loss_aware_decay`'s state around the wrapped optimizer's.

    Attributes:
      inner: the wrapped optimizer's state.
      count: int32 []: the updates made so far (t, the argument of a learning-rate schedule).
      loss_state: float32 [2]: [ℓ̄, seen], `lopt.parts.features.loss_features`' state.
      loss_start: float32 []: ℓ_0, the first loss given (0 before it).
    """
    inner: Any
    count: jax.Array
    loss_state: jax.Array
    loss_start: jax.Array


def loss_aware_decay(inner: optax.GradientTransformation, learning_rate: Any, rate: float, *,
                     loss_power: float = 1.0, loss_max: float = 10.0, loss_free: float = 1.0,
                     conv_loss_free: float = 0.0, roles: Sequence[str] = DEFAULT_ROLES,
                     weight_dimension_numbers: Any = None) -> optax.GradientTransformationExtraArgs:
    """`inner` plus decoupled weight decay whose rate grows as the training loss falls (module docstring).

        Δp = u_t − η_t · λ₀ · φ_t · p          for every p whose role's kind is in `roles`
        φ_t = clip((ℓ_0 / (ρ_free · ℓ̄_t))^p, 1, φ_max)       (1 with loss_power 0, or before a loss is given)

    u_t is `inner`'s update, η_t `learning_rate` (AdamW's: the decay is AdamW's, λ₀ p times the
    step size, while the loss stays within ρ_free of its start). With `learning_rate=None`, η_t is
    each tensor's own step size inside a learned update that takes `lopt.rules.per_tensor`'s
    interface (e.g. `lopt.Celo2LOpt`'s): λ₀ φ_t enters its bracket, Δp = −η (d + λ p), in the
    architecture's own order of operations; `lopt.rules.loss_aware_decay(celo2.opt_fn(theta), None, 0.03)`. Pass the loss:
    `tx.update(grads, state, params, loss=loss)`. Example, AdamW with the decay `celo2_v9` deploys:
    `lopt.rules.loss_aware_decay(optax.adam(1e-3), 1e-3, 0.03, loss_free=3.0)`.

    Args:
      inner: any optax transform (it sees the same extra args); the wrapper's update needs `params`.
      learning_rate: η, a float or an optax schedule of the update count t; None: each tensor's own
        step size, `inner` a `lopt.rules.per_tensor.PerTensorTransform`.
      rate: λ₀ > 0.
      loss_power: p ≥ 0 (0: a fixed rate λ₀).
      loss_max: φ_max ≥ 1.
      loss_free: ρ_free > 0.
      conv_loss_free: conv kernels' ρ_free (0: `loss_free`).
      roles: the role kinds that decay (`lopt.param_roles.KINDS`; default weight matrices only).
      weight_dimension_numbers: roles where inference should not decide (`lopt.param_roles.infer`).

    Returns:
      An `optax.GradientTransformationExtraArgs` whose state is a `LossAwareDecayState` (a
      `PerTensorTransform` where `inner` is one).

    Raises:
      ValueError: a constant out of range, or `learning_rate=None` around a transform without the interface.
    """
    check_weight_decay_options(rate, False, 1.0, tuple(roles))
    check_loss_options(rate, loss_power, loss_max, loss_free, conv_loss_free)
    if known(rate) and rate == 0:
        raise ValueError("loss_aware_decay needs rate > 0 (without a decay, use the optimizer itself)")
    inner = optax.with_extra_args_support(inner)
    if learning_rate is None and not per_tensor.supports(inner):
        raise ValueError("loss_aware_decay(learning_rate=None) reads each tensor's step size inside a learned update "
                         "(lopt.rules.per_tensor); this transform has none: pass its learning rate")

    def init_fn(params):
        zero = jnp.zeros((), jnp.float32)
        return LossAwareDecayState(inner=inner.init(params), count=jnp.zeros((), jnp.int32),
                                   loss_state=ft.init_loss_state(), loss_start=zero)

    def update_fn(updates, state, params=None, **extra_args):
        loss = extra_args.get("loss")
        _, loss_state = ft.loss_features(loss, state.loss_state)
        start = track_loss_start(state.loss_start, state.loss_state, loss)
        if learning_rate is None:  # inside the learned update, times each tensor's own η
            rule = LossAwareRule(rate, start, loss_state[0], loss_power, loss_max, loss_free, conv_loss_free,
                                 tuple(roles))
            steps, inner_state = inner.update(updates, state.inner, params, **per_tensor.forward(inner, rule, extra_args))
            return steps, LossAwareDecayState(inner=inner_state, count=state.count + 1, loss_state=loss_state,
                                              loss_start=start)
        steps, inner_state = inner.update(updates, state.inner, params, **per_tensor.forward(inner, None, extra_args))
        eta = learning_rate(state.count) if callable(learning_rate) else learning_rate
        leaves, treedef = jax.tree_util.tree_flatten(steps)
        out = []
        for s, p, role in zip(leaves, treedef.flatten_up_to(params), leaf_roles(params, weight_dimension_numbers,
                                                                                 "loss_aware_decay")):
            if is_decayed(role, roles):
                lam = jnp.asarray(rate, jnp.float32)
                if loss_power > 0:
                    lam = lam * loss_factor(start, loss_state[0], loss_power, loss_max,
                                            loss_free_of(role, loss_free, conv_loss_free))
                s = (jnp.asarray(s, jnp.float32) - eta * lam * jnp.asarray(p, jnp.float32)).astype(jnp.result_type(s))
            out.append(s)
        return treedef.unflatten(out), LossAwareDecayState(inner=inner_state, count=state.count + 1,
                                                           loss_state=loss_state, loss_start=start)

    return per_tensor.wrap(inner, init_fn, update_fn)


class LossAwareRule(per_tensor.TensorRule):
    """`loss_aware_decay`'s rate given to a learned update (`lopt.rules.per_tensor`): λ₀ φ_t on decayed roles.

    Args:
      rate: λ₀ > 0.
      loss_start: float32 [] ℓ_0 (`track_loss_start`).
      loss_ema: float32 [] ℓ̄_t, this step's loss EMA.
      loss_power: p ≥ 0, as `loss_aware_decay`'s.
      loss_max: φ_max ≥ 1.
      loss_free: ρ_free > 0.
      conv_loss_free: conv kernels' ρ_free (0: `loss_free`).
      roles: the role kinds that decay.
    """

    def __init__(self, rate, loss_start, loss_ema, loss_power, loss_max, loss_free, conv_loss_free, roles):
        self.rate, self.start, self.ema = rate, loss_start, loss_ema
        self.power, self.max, self.free, self.conv_free, self.roles = loss_power, loss_max, loss_free, conv_loss_free, roles
        self._lams = {}  # λ per ρ_free (conv kernels' own or the others'), computed once for each

    def decay(self, role):
        """λ₀ φ_t(ρ_free of `role`) where `role`'s kind decays, else None (float32 [])."""
        if not is_decayed(role, self.roles):
            return None
        key = bool(self.conv_free > 0 and role.is_conv)  # which ρ_free (constants may be jax values)
        if key not in self._lams:
            lam = jnp.asarray(self.rate, jnp.float32)
            if self.power > 0:
                lam = lam * loss_factor(self.start, self.ema, self.power, self.max,
                                        loss_free_of(role, self.free, self.conv_free))
            self._lams[key] = lam
        return self._lams[key]

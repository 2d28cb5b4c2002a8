"""Celo (Moudgil et al. 2025): a tiny per-parameter MLP whose step a learned LSTM scheduler scales.

Every step, with the horizon N and the training loss ℓ:

    s = scheduler(t, N, ℓ)                          `lopt.parts.learned_scheduler` (one scalar)
    g ← clip(g, −1000, 1000)

Accumulators per tensor p (float32; a leading axis indexes the K decays):

    m_k ← β_k m_k + (1 − β_k) g                      `momentum_decays`        [K, *p]
    v   ← β_v v + (1 − β_v) g²                        `rms_decay`              [*p]
    factored second moments, g̃² = g² + 1e-30, decays γ_j (`adafactor_decays`, as many as the β_k):
      a tensor of rank ≥ 2 factors its two largest axes a (largest) and b (second; ties: the
      later axis is the larger), keeping r_j ← γ_j r_j + (1 − γ_j) mean_a g̃² and
      c_j ← γ_j c_j + (1 − γ_j) mean_b g̃², and v̂_j^{-½} = rsqrt(r_j / mean_b r_j) ⊗ rsqrt(c_j)
      (each rsqrt of max(·, 1e-9)); a vector or scalar keeps d_j ← γ_j d_j + (1 − γ_j) g̃².

F = 6 + 2K + 6K features per parameter (30 with K = 3), in this order, with ρ = (v + 1e-6)^{-½}:

    g, clip(g, ±0.1), p, m_k, v, m_k ρ, ρ, y_j, g ρ, R_j, C_j, (R_j + 1e-8)^{-½}, (C_j + 1e-8)^{-½}, m_j v̂_j^{-½}

where y_j = g v̂_j^{-½} (vectors: g · rsqrt(max(d_j + 1e-9, 1e-9))), R_j and C_j are r_j and c_j
broadcast to p's shape (vectors: d_j for both) and, for vectors, m_j v̂_j^{-½} = m_j d_j^{-½}.
Each feature is divided by its root-mean-square over the tensor, x / √(mean x² + 1e-5); a ReLU
MLP [F] → 4 → 4 → 3 gives (d, μ, unused) per parameter, and

    Δp = −s · d · (σ_p · exp(μ · exp_mult)) · step_mult,    σ_p = √(mean p² + 1e-9).

Theta: {"scheduler": `learned_scheduler.scheduler_init`, "mlp": {"input": dense [F, 4],
"hidden_1": dense [4, 4], "output": dense [4, 3]}}. `lopt.published.load("celo", num_steps=N)`
runs the authors' released theta; the update needs the loss (`update(..., loss=loss)`) and N.
"""
from __future__ import annotations

from typing import Any, Optional

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax

from lopt.base import LearnedOptimizer
from lopt.parts import learned_scheduler as sched
from lopt.parts import tree_checks
from lopt.parts.nn import dense_init, elementwise_mlp, later_layers
from lopt.parts.spec import PARAM, ArchSpec, StateField, iteration_field

GRAD_CLIP = 1000.0
# the numbers of the update that are not config, by name (`Celo.spec().constants`; lopt.torch reads them there)
CONSTANTS = {"grad_clip": GRAD_CLIP, "feature_clip": 0.1, "g2_eps": 1e-30, "rsqrt_floor": 1e-9, "row_eps": 1e-9,
             "full_eps": 1e-9, "rms_eps": 1e-6, "factor_eps": 1e-8, "norm_eps": 1e-5, "scale_eps": 1e-9}


def feature_names(num_decays: int) -> tuple[str, ...]:
    """The F = 6 + 8K features of the module docstring, named in their order (K = `num_decays`).

    Returns:
      ("g", "clip_g", "p", "m_1".., "v", "m_1_over_sqrt_v".., "rsqrt_v", "g_over_sqrt_f_1".., "g_over_sqrt_v",
      "row_1".., "col_1".., "rsqrt_row_1".., "rsqrt_col_1".., "m_1_over_sqrt_f_1"..), the j-th factored
      moment paired with the j-th momentum in the last K.
    """
    ks = range(1, num_decays + 1)
    each = lambda fmt: tuple(fmt.format(k) for k in ks)
    return (("g", "clip_g", "p") + each("m_{}") + ("v",) + each("m_{}_over_sqrt_v") + ("rsqrt_v",)
            + each("g_over_sqrt_f_{}") + ("g_over_sqrt_v",) + each("row_{}") + each("col_{}") + each("rsqrt_row_{}")
            + each("rsqrt_col_{}") + each("m_{0}_over_sqrt_f_{0}"))


@flax.struct.dataclass
class CeloState:
    """Celo's optimizer state.

    Attributes:
      momenta: per leaf, float32 [K, *p.shape]: m_k.
      rms: per leaf, float32 [*p.shape]: v.
      fac_row: per leaf, float32 [K, *p.shape without axis a] (rank ≥ 2) or [K, 0]: r_j.
      fac_col: per leaf, float32 [K, *p.shape without axis b] (rank ≥ 2) or [K, 0]: c_j.
      fac_full: per leaf, float32 [K, *p.shape] (rank < 2) or [K, 0]: d_j.
      scheduler: the learned scheduler's state, a `lopt.parts.learned_scheduler.SchedulerState` (loss
        averages and the LSTM's h and c).
      iteration: int32 []: the number of updates so far.
    """
    momenta: Any
    rms: Any
    fac_row: Any
    fac_col: Any
    fac_full: Any
    scheduler: Any  # a lopt.parts.learned_scheduler.SchedulerState
    iteration: jax.Array


def factored_axes(shape: tuple) -> Optional[tuple[int, int]]:
    """The axes (b, a) whose second moments are factored: a the largest, b the second largest.

    Args:
      shape: a tensor's shape.

    Returns:
      None for rank < 2, else (b, a) from a stable sort of the sizes (equal sizes: the later axis
      counts as larger).
    """
    if len(shape) < 2:
        return None
    order = np.argsort(np.asarray(shape), kind="stable")
    return int(order[-2]), int(order[-1])


def factored_shapes(shape: tuple, num_decays: int) -> tuple[tuple, tuple, tuple]:
    """The shapes of one tensor's factored second moments (r, c, d), as in `CeloState`.

    Args:
      shape: the tensor's shape s.
      num_decays: K.

    Returns:
      rank >= 2: ([K, *s without a], [K, *s without b], [K, 0]); below: ([K, 0], [K, 0], [K, *s]).
    """
    shape, empty = tuple(shape), (num_decays, 0)
    axes = factored_axes(shape)
    if axes is None:
        return empty, empty, (num_decays,) + shape
    b, a = axes
    drop = lambda axis: (num_decays,) + tuple(int(n) for n in np.delete(shape, axis))
    return drop(a), drop(b), empty


def init_factored(p: Any, num_decays: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Zero factored second moments of one tensor: (r, c, d) with the shapes of `factored_shapes`."""
    return tuple(jnp.zeros(s, jnp.float32) for s in factored_shapes(jnp.shape(p), num_decays))


def _safe_rsqrt(x: jax.Array) -> jax.Array:
    return jax.lax.rsqrt(jnp.maximum(x, CONSTANTS["rsqrt_floor"]))


def _bcast(x: jax.Array, ndim: int) -> jax.Array:
    return x.reshape((-1,) + (1,) * ndim)


def leaf_features(g: jax.Array, p: jax.Array, m: jax.Array, v: jax.Array, row: jax.Array, col: jax.Array,
                  full: jax.Array, fac_decays: jax.Array) -> tuple[list[jax.Array], tuple]:
    """One tensor's F features (un-normalised) and its new factored moments.

    Args:
      g: the clipped gradient, float32 [*s].
      p: the parameter, float32 [*s].
      m: the momenta after this step, float32 [K, *s].
      v: the second moment after this step, float32 [*s].
      row, col, full: the factored moments before this step (`init_factored`).
      fac_decays: γ_j, float32 [K].

    Returns:
      (the F features, each float32 [*s], in the order of the module docstring; (row, col, full) updated).
    """
    shape, k = g.shape, m.shape[0]
    gam = _bcast(fac_decays, len(shape) - 1 if factored_axes(shape) else len(shape))
    g2 = g * g + CONSTANTS["g2_eps"]
    axes = factored_axes(shape)
    if axes is not None:
        b, a = axes
        row = gam * row + (1.0 - gam) * jnp.mean(g2, axis=a)
        col = gam * col + (1.0 - gam) * jnp.mean(g2, axis=b)
        row_b = 1 + (b - 1 if b > a else b)  # axis b of r_j (axis a removed), behind the decay axis
        row_mean = jnp.mean(row, axis=row_b, keepdims=True) + CONSTANTS["row_eps"]
        row_factor = jnp.expand_dims(_safe_rsqrt(row / row_mean), 1 + a)
        col_factor = jnp.expand_dims(_safe_rsqrt(col), 1 + b)
        fac_g = g * row_factor * col_factor
        big_r = jnp.broadcast_to(jnp.expand_dims(row, 1 + a), (k,) + shape)
        big_c = jnp.broadcast_to(jnp.expand_dims(col, 1 + b), (k,) + shape)
        fac_m = m * row_factor * col_factor
    else:
        full = gam * full + (1.0 - gam) * g2
        fac_g = g * _safe_rsqrt(full + CONSTANTS["full_eps"])
        big_r = big_c = full
        fac_m = m * full ** -0.5
    rho = jax.lax.rsqrt(v + CONSTANTS["rms_eps"])
    clip, eps = CONSTANTS["feature_clip"], CONSTANTS["factor_eps"]
    feats = [g, jnp.clip(g, -clip, clip), p, *m, v, *(m * rho), rho, *fac_g, g * rho, *big_r, *big_c,
             *jax.lax.rsqrt(big_r + eps), *jax.lax.rsqrt(big_c + eps), *fac_m]
    return feats, (row, col, full)


@jax.jit
def leaf_update(g: Any, p: Any, m: jax.Array, v: jax.Array, row: jax.Array, col: jax.Array, full: jax.Array,
                s: jax.Array, decays: tuple, layers: list, mults: tuple) -> tuple:
    """One tensor's Celo update and new accumulators (the module docstring's math).

    Jitted, so that an eager update rounds as a jitted one does (inlined when the update is jitted).

    Args:
      g: the gradient (any float dtype) [*s].
      p: the parameter [*s].
      m, v, row, col, full: its accumulators before this step (`CeloState`'s per-leaf entries).
      s: the scheduler's multiplier, float32 [].
      decays: (β_k [K], β_v [], γ_j [K]), float32.
      layers: the MLP's [(W, b)], the output layer cut to (d, μ).
      mults: (exp_mult, step_mult), float32 [].

    Returns:
      (Δp in p's dtype, m, v, row, col, full).
    """
    betas, beta_v, gammas = decays
    g32 = jnp.clip(jnp.asarray(g, jnp.float32), -GRAD_CLIP, GRAD_CLIP)
    p32 = jnp.asarray(p, jnp.float32)
    m = _bcast(betas, g32.ndim) * m + (1.0 - _bcast(betas, g32.ndim)) * g32
    v = beta_v * v + (1.0 - beta_v) * (g32 * g32)
    feats, (row, col, full) = leaf_features(g32, p32, m, v, row, col, full, gammas)
    feats = [f * jax.lax.rsqrt(CONSTANTS["norm_eps"] + jnp.mean(jnp.square(f))) for f in feats]
    direction, magnitude = elementwise_mlp(feats, layers)
    scale = jnp.sqrt(jnp.mean(jnp.square(p32)) + CONSTANTS["scale_eps"])
    step = s * (direction * (scale * jnp.exp(magnitude * mults[0])) * mults[1])
    return -step.astype(jnp.result_type(p)), m, v, row, col, full


class Celo(LearnedOptimizer):
    """Celo: a per-parameter MLP over 30 momentum / RMS / factored features, scaled by a learned scheduler.

    The math is in the module docstring. Theta: {"scheduler": ..., "mlp": ...} (module docstring).

    Args:
      lstm_hidden: H, the scheduler LSTM's width.
      hidden_size: the per-parameter MLP's hidden width.
      hidden_layers: its number of hidden layers (≥ 1).
      momentum_decays: β_k (K ≥ 1).
      rms_decay: β_v.
      adafactor_decays: γ_j, as many as `momentum_decays` (the features m_j v̂_j^{-½} pair them).
      exp_mult: the scale of the magnitude output μ.
      step_mult: the base step size.
    """

    lstm_hidden: int = 64
    hidden_size: int = 4
    hidden_layers: int = 2
    momentum_decays: tuple[float, ...] = (0.9, 0.99, 0.999)
    rms_decay: float = 0.999
    adafactor_decays: tuple[float, ...] = (0.9, 0.99, 0.999)
    exp_mult: float = 0.001
    step_mult: float = 0.001

    #: the axes (b, a) whose second moments are factored (the module's `factored_axes`; lopt.torch reads it here)
    factored_axes = staticmethod(factored_axes)

    def check_config(self) -> None:
        if not self.momentum_decays or len(self.adafactor_decays) != len(self.momentum_decays):
            raise ValueError(f"Celo: adafactor_decays {self.adafactor_decays} must be as many as momentum_decays "
                             f"{self.momentum_decays} (at least one)")
        if self.hidden_layers < 1 or self.hidden_size < 1 or self.lstm_hidden < 1:
            raise ValueError(f"Celo: lstm_hidden, hidden_size and hidden_layers must be >= 1, got "
                             f"{self.lstm_hidden}, {self.hidden_size}, {self.hidden_layers}")

    @property
    def num_features(self) -> int:
        """F = 6 + 2K + 6K, the per-parameter MLP's input width."""
        return 6 + 8 * len(self.momentum_decays)

    def spec(self) -> ArchSpec:
        """Its features, constants and state layout (`lopt.parts.spec`; read by `lopt.torch` too).

        Returns:
          features `feature_names(K)`; constants `CONSTANTS`; state "momenta" `[K, *s]`, "rms" `[*s]`,
          "fac_row", "fac_col", "fac_full" (shapes of `init_factored`, JAX layout), the scheduler's
          (`learned_scheduler.state_fields`) and "iteration".
        """
        k = len(self.momentum_decays)
        fac = lambda which: lambda shape: factored_shapes(shape, k)[which]
        state = (StateField("momenta", PARAM, (k,), doc="the momenta m_k"),
                 StateField("rms", PARAM, doc="the second moment v"),
                 StateField("fac_row", PARAM, shape_of=fac(0), doc="r_j (rank >= 2; else [K, 0])"),
                 StateField("fac_col", PARAM, shape_of=fac(1), doc="c_j (rank >= 2; else [K, 0])"),
                 StateField("fac_full", PARAM, shape_of=fac(2), doc="d_j (rank < 2; else [K, 0])"))
        return ArchSpec("Celo", feature_names(k), dict(CONSTANTS),
                        state + sched.state_fields(self.lstm_hidden) + (iteration_field(),))

    def init(self, key: jax.Array) -> dict:
        k_sched, k_in, k_hidden, k_out = jax.random.split(key, 4)
        mlp = {"input": dense_init(k_in, self.num_features, self.hidden_size)}
        for i, k in enumerate(jax.random.split(k_hidden, self.hidden_layers - 1), start=1):
            mlp[f"hidden_{i}"] = dense_init(k, self.hidden_size, self.hidden_size)
        mlp["output"] = dense_init(k_out, self.hidden_size, 3)
        return {"scheduler": sched.scheduler_init(k_sched, self.lstm_hidden), "mlp": mlp}

    def opt_fn(self, theta: dict, *, num_steps: Optional[Any] = None,
               is_training: bool = False) -> optax.GradientTransformationExtraArgs:
        del is_training
        self.check_theta(theta, "Celo.opt_fn")
        if num_steps is None:
            raise ValueError("Celo schedules its steps by training progress: pass num_steps=<the number of updates "
                             "you will make> to opt_fn")
        k = len(self.momentum_decays)
        decays = (jnp.asarray(self.momentum_decays, jnp.float32), jnp.asarray(self.rms_decay, jnp.float32),
                  jnp.asarray(self.adafactor_decays, jnp.float32))
        mults = (jnp.asarray(self.exp_mult, jnp.float32), jnp.asarray(self.step_mult, jnp.float32))
        mlp = theta["mlp"]
        w_out = mlp["output"]["w"][:, :2], mlp["output"]["b"][:2]
        layers = [(mlp["input"]["w"], mlp["input"]["b"])] + later_layers(mlp, self.hidden_layers)[:-1] + [w_out]

        def init_fn(params):
            zeros = lambda p: jnp.zeros(jnp.shape(p), jnp.float32)
            facs = jax.tree_util.tree_map(lambda p: init_factored(p, k), params)
            treedef = jax.tree_util.tree_structure(params)
            rows, cols, fulls = zip(*treedef.flatten_up_to(facs)) if treedef.num_leaves else ((), (), ())
            return CeloState(jax.tree_util.tree_map(lambda p: jnp.zeros((k,) + jnp.shape(p), jnp.float32), params),
                             jax.tree_util.tree_map(zeros, params), treedef.unflatten(rows),
                             treedef.unflatten(cols), treedef.unflatten(fulls),
                             sched.init_state(theta["scheduler"], num_steps), jnp.zeros((), jnp.int32))

        def update_fn(updates, state, params=None, *, loss=None, **extra_args):
            del extra_args
            tree_checks.require_params(updates, params, "Celo")
            treedef, gs, (ps, ms, vs, rows, cols, fulls) = tree_checks.leaves_of(
                updates, params, state.momenta, state.rms, state.fac_row, state.fac_col, state.fac_full)
            loss = sched.training_loss(loss, "Celo")
            s, sched_state = sched.step(theta["scheduler"], state.scheduler, loss, state.iteration, num_steps)
            out = {name: [] for name in ("u", "m", "v", "row", "col", "full")}
            for leaf in zip(gs, ps, ms, vs, rows, cols, fulls):
                for name, value in zip(out, leaf_update(*leaf, s, decays, layers, mults)):
                    out[name].append(value)
            unf = treedef.unflatten
            return unf(out["u"]), CeloState(unf(out["m"]), unf(out["v"]), unf(out["row"]), unf(out["col"]),
                                            unf(out["full"]), sched_state, state.iteration + 1)

        return optax.GradientTransformationExtraArgs(init_fn, update_fn)

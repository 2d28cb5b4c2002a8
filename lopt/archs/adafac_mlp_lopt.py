"""AdafacMLPLOpt: "small_fc_lopt" (Metz et al. 2022), a tiny per-parameter MLP over momentum,
RMS and Adafactor-style factored second-moment features.

Accumulators per tensor p with gradient g (float32; a leading axis indexes the decays):

    m_k   ← β_k m_k + (1 − β_k) g                      k over `momentum_decays`  [K_m, *p]
    v     ← β_v v + (1 − β_v) g²                        `rms_decay`               [*p]
    r_j   ← β_j r_j + (1 − β_j) mean_cols(g²)           j over `adafactor_decays` [K_f, *p[:-1]]
    c_j   ← β_j c_j + (1 − β_j) mean_rows(g²)                                     [K_f, *p[:-2], p[-1]]
    v̂_j  = (r_j / mean(r_j)) ⊗ c_j                      (matrices: the last two axes are factored;
                                                          vectors and scalars keep the full g² in r_j)

Every decay starts at its configured value and is learned: β = sigmoid(θ_β).

Features (F = 4 + 2K_m + 3K_f + K_m·K_f, 28 with the defaults):
    g, p, m_k, √v, m_k·v^{-½}, v^{-½}, g·v̂_j^{-½}, r̃_j^{-½}, c_j^{-½}, m_k·v̂_j^{-½} (all k, j)
each divided by its RMS over the tensor, plus the tanh step embedding (and with `use_num_steps`
the progress features) shared by the tensor. MLP [F] -> hidden (ReLU) ×`hidden_layers` -> (d, m):

    Δp = −d · exp(m · exp_mult) · step_mult.

How it is computed: the RMS normalisation and the step embedding are folded into the first layer's
weights and bias per tensor, and with hidden size 4 the MLP is written as unrolled
multiply-adds, so one fused XLA loop reads g, p and the state once and writes the update and
the new state — no [N, F] feature array exists. The features' mean squares of big matrices
come from the squared base arrays and the rank-1 factors, block by block (`feature_mean_squares`).
The accumulators and features are `lopt.parts.factored`'s (shared with HyperLOpt); the names
imported from there stay importable from this module.
"""
from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp
import optax

from lopt.parts import features as ft
from lopt.base import LearnedOptimizer, layout_option
from lopt.parts import factored
from lopt.parts.factored import (AdafacState, LeafAccum, accumulate, decay_logits, feature_mean_squares,  # noqa: F401
                                 init_accum, init_state, leaf_features, num_leaf_features)
from lopt.parts.nn import elementwise_mlp, per_param_mlp_init, shared_bias
from lopt.parts.spec import ArchSpec
from lopt.parts import tree_checks


class AdafacMLPLOpt(LearnedOptimizer):
    """small_fc_lopt: a per-parameter MLP (hidden 4) over momentum/RMS/factored features.

    Accumulators, features and the step Δp = −d · exp(m · exp_mult) · step_mult are in the module
    docstring. Theta: the per-parameter MLP of `lopt.parts.nn.per_param_mlp_init` (F inputs, 2 outputs)
    plus "decays": `decay_logits(...)`, every decay learned as β = σ(θ_β).

    Args:
      hidden_size: H, the width of every hidden layer.
      hidden_layers: the number of hidden ReLU layers (≥ 1).
      momentum_decays: the initial momentum decays (K_m ≥ 1).
      rms_decay: the initial decay of the second moment v.
      adafactor_decays: the initial decays of the factored second moments (K_f ≥ 1).
      step_mult: the step's scale.
      exp_mult: the magnitude output's scale inside exp.
      timescales: τ of the step embedding tanh(t/τ − 1).
      use_num_steps: also feed the progress features (min(t/N, 1), log1p(N)/10, 1), N the
        `num_steps` given to `opt_fn` (zeros when it is None).
      layout: the update layout, "cpu" or "accelerator" (`lopt.base.layout_option`; speed only).
    """

    hidden_size: int = 4
    hidden_layers: int = 2
    momentum_decays: tuple[float, ...] = (0.9, 0.99, 0.999)
    rms_decay: float = 0.999
    adafactor_decays: tuple[float, ...] = (0.9, 0.99, 0.999)
    step_mult: float = 1e-3
    exp_mult: float = 1e-3
    timescales: tuple[float, ...] = ft.TIMESCALES
    use_num_steps: bool = False
    layout: Any = layout_option()

    def check_config(self) -> None:
        if self.hidden_layers < 1 or self.hidden_size < 1 or not self.momentum_decays or not self.adafactor_decays:
            raise ValueError("AdafacMLPLOpt needs hidden_layers, hidden_size >= 1 and non-empty decays")

    @property
    def num_features(self) -> int:
        """F, the number of per-parameter features (28 with the default decays)."""
        return self.spec().num_features

    def spec(self) -> ArchSpec:
        """Its features, constants and state layout (`lopt.parts.spec`; read by `lopt.torch` too).

        Returns:
          features `factored.feature_names(K_m, K_f)`; constants "eps" (`features.EPS`) and
          "row_eps" (`factored.ROW_EPS`); state `factored.state_fields(K_m, K_f)` (an `AdafacState`).
        """
        n_mom, n_fac = len(self.momentum_decays), len(self.adafactor_decays)
        return ArchSpec("AdafacMLPLOpt", factored.feature_names(n_mom, n_fac),
                        {"eps": ft.EPS, "row_eps": factored.ROW_EPS}, factored.state_fields(n_mom, n_fac))

    def init(self, key: jax.Array) -> dict:
        theta = per_param_mlp_init(key, self.num_features, len(self.timescales),
                                   ft.NUM_PROGRESS if self.use_num_steps else 0, self.hidden_size, self.hidden_layers)
        theta["decays"] = decay_logits(self.momentum_decays, self.rms_decay, self.adafactor_decays)
        return theta

    def opt_fn(self, theta: dict, *, num_steps: Optional[Any] = None,
               is_training: bool = False) -> optax.GradientTransformationExtraArgs:
        """The optimizer theta defines (the update is in the module docstring).

        Args:
          theta: meta-parameters, as from `init`.
          num_steps: the horizon N of the progress features (may be traced; read only with
            `use_num_steps`).
          is_training: accepted for the `LearnedOptimizer` interface and ignored: the update is the
            same while meta-training and after.

        Returns:
          An `optax.GradientTransformationExtraArgs`; its update reads `params` and ignores extra
          arguments such as `loss`.
        """
        del is_training
        self.check_theta(theta, "AdafacMLPLOpt.opt_fn")
        n_mom, n_fac = len(self.momentum_decays), len(self.adafactor_decays)
        eps = self.spec().constants["eps"]

        def init_fn(params):
            return init_state(params, n_mom, n_fac)

        def update_fn(updates, state, params=None, **extra_args):
            del extra_args
            tree_checks.require_params(updates, params, "AdafacMLPLOpt")
            dec = jax.tree_util.tree_map(jax.nn.sigmoid, theta["decays"])
            bias = shared_bias(theta["input"], state.iteration, self.timescales, num_steps)
            rest = [(theta[f"hidden_{i}"]["w"], theta[f"hidden_{i}"]["b"]) for i in range(1, self.hidden_layers)]
            rest.append((theta["output"]["w"], theta["output"]["b"]))

            def leaf(g, p, m, v, row, col):
                acc = LeafAccum(m, v, row, col)
                if jnp.size(p) == 0:
                    return jnp.zeros_like(p), acc
                g32, p32 = jnp.asarray(g, jnp.float32), jnp.asarray(p, jnp.float32)
                acc = accumulate(g32, acc, dec["momentum"], dec["rms"][0], dec["adafactor"])
                feats = leaf_features(g32, p32, acc)
                ms = feature_mean_squares(g32, p32, acc, layout=self.update_layout)
                w1 = theta["input"]["w"] * jax.lax.rsqrt(ms + eps)[:, None]
                d, mag = elementwise_mlp(feats, [(w1, bias)] + rest)
                step = d * jnp.exp(mag * self.exp_mult) * self.step_mult
                return jnp.broadcast_to(-step, jnp.shape(p)).astype(jnp.result_type(p)), acc

            treedef, gs, (ps, ms, vs, rows, cols) = tree_checks.leaves_of(
                updates, params, state.momenta, state.rms, state.fac_row, state.fac_col)
            outs = [leaf(*args) for args in zip(gs, ps, ms, vs, rows, cols)]
            unf = lambda xs: treedef.unflatten(list(xs))
            new_updates = unf(o[0] for o in outs)
            new_state = AdafacState(*(unf(o[1][i] for o in outs) for i in range(4)), state.iteration + 1)
            return new_updates, new_state

        return optax.GradientTransformationExtraArgs(init_fn, update_fn)

"""HyperLOpt: a VeLO-style hypernetwork learned optimizer (Metz et al. 2022, "VeLO").

A per-tensor LSTM (shared weights, own state (h_i, c_i) [H]) reads
    z_i = [log mean x_f²/10 for each per-parameter feature f (F), log(1+numel)/10,
           step embedding (T), progress (3), loss (2)]
and *generates the weights* of tensor i's per-parameter MLP: with w the flat vector of all
MLP weights (P numbers),

    w_i = w_base + (h_i G) · gen_scale,      G [H, P],
    lr_i = exp(h_i · w_lr),

so every tensor gets its own small MLP, re-generated every step. The per-parameter features are
AdafacMLPLOpt's (`lopt.parts.factored`: momenta, RMS, factored second moments; F = 28 by
default, RMS-normalised per tensor) and the output is Δp = −d · exp(m · exp_mult) · step_mult · lr_i. The defaults (LSTM 16,
MLP hidden 4) keep one step cheap and theta at ~6k numbers, so it meta-trains on a CPU;
VeLO itself used a much larger LSTM and ran ES for ~4000 TPU-months.
`loss=` is optional (loss features 0 without); `num_steps=None` zeroes the progress features.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from lopt.parts import factored
from lopt.parts.factored import AdafacState
from lopt.parts import features as ft
from lopt.base import LearnedOptimizer, layout_option
from lopt.parts.nn import dense_init, elementwise_mlp, lstm_fields, lstm_init, lstm_step
from lopt.parts.spec import ArchSpec
from lopt.parts import tree_checks


class HyperLOptState(NamedTuple):
    """HyperLOpt's optimizer state.

    Attributes:
      accumulators: an `AdafacState` (momenta, RMS, factored moments, step count).
      lstm_h: float32 [L, H]: the LSTM's h, one row per leaf in the params' tree order.
      lstm_c: float32 [L, H]: the LSTM's c.
      loss_state: float32 [2]: the loss EMA and a seen flag (`features.loss_features`).
    """
    accumulators: AdafacState
    lstm_h: jax.Array
    lstm_c: jax.Array
    loss_state: jax.Array


class HyperLOpt(LearnedOptimizer):
    """Per-tensor LSTM hypernetwork emitting each tensor's per-parameter MLP weights.

    The math is in the module docstring. Theta: {"lstm": `lopt.parts.nn.lstm_init`, "generator" G [H, P],
    "w_base" [P], "w_lr" [H], "decays": `lopt.parts.factored.decay_logits(...)`} (decays learned as
    β = σ(θ_β), as in AdafacMLPLOpt).

    Args:
      lstm_hidden: H, the LSTM's state width.
      mlp_hidden: the width of the generated MLP's hidden layers.
      mlp_layers: the number of hidden ReLU layers of the generated MLP (≥ 1).
      momentum_decays: the initial momentum decays (K_m).
      rms_decay: the initial decay of the second moment v.
      adafactor_decays: the initial decays of the factored second moments (K_f).
      gen_scale: the scale of the generated weight offsets h_i G.
      step_mult: the step's scale.
      exp_mult: the magnitude output's scale inside exp.
      timescales: τ of the step embedding tanh(t/τ − 1).
      layout: the update layout, "cpu" or "accelerator" (`lopt.base.layout_option`; speed only).
    """

    lstm_hidden: int = 16
    mlp_hidden: int = 4
    mlp_layers: int = 1
    momentum_decays: tuple[float, ...] = (0.9, 0.99, 0.999)
    rms_decay: float = 0.999
    adafactor_decays: tuple[float, ...] = (0.9, 0.99, 0.999)
    gen_scale: float = 0.1
    step_mult: float = 1e-3
    exp_mult: float = 1e-3
    timescales: tuple[float, ...] = ft.TIMESCALES
    layout: Any = layout_option()

    def check_config(self) -> None:
        if min(self.lstm_hidden, self.mlp_hidden, self.mlp_layers) < 1:
            raise ValueError("HyperLOpt needs positive sizes")

    @property
    def num_features(self) -> int:
        """F, the number of per-parameter features (28 with the default decays)."""
        return self.spec().num_features

    def spec(self) -> ArchSpec:
        """Its features, constants and state layout (`lopt.parts.spec`; read by `lopt.torch` too).

        Returns:
          features `factored.feature_names(K_m, K_f)`; constants "eps" (`features.EPS`),
          "row_eps" (`factored.ROW_EPS`); state `factored.state_fields` (the `AdafacState`
          "accumulators"), "lstm_h", "lstm_c" ([H] per tensor) and "loss_state".
        """
        n_mom, n_fac = len(self.momentum_decays), len(self.adafactor_decays)
        return ArchSpec("HyperLOpt", factored.feature_names(n_mom, n_fac),
                        {"eps": ft.EPS, "row_eps": factored.ROW_EPS},
                        factored.state_fields(n_mom, n_fac) + lstm_fields(self.lstm_hidden) + (ft.loss_state_field(),))

    def layer_shapes(self) -> list[tuple[int, int]]:
        """The generated MLP's (fan_in, fan_out) per layer: [(F, H), (H, H) × (mlp_layers − 1), (H, 2)],
        F = `num_features`, H = `mlp_hidden` (the order its weights are generated in)."""
        h = self.mlp_hidden
        return [(self.num_features, h)] + [(h, h)] * (self.mlp_layers - 1) + [(h, 2)]

    @property
    def num_generated(self) -> int:
        """P, the number of generated MLP weights (all layers' W and b)."""
        return sum(a * b + b for a, b in self.layer_shapes())

    def _unflatten_mlp(self, flat: jax.Array) -> list[tuple[jax.Array, jax.Array]]:
        layers, at = [], 0
        for a, b in self.layer_shapes():
            layers.append((flat[at:at + a * b].reshape(a, b), flat[at + a * b:at + a * b + b]))
            at += a * b + b
        return layers

    def init(self, key: jax.Array) -> dict:
        keys = jax.random.split(key, len(self.layer_shapes()) + 2)
        base = []
        for k, (a, b) in zip(keys[2:], self.layer_shapes()):
            layer = dense_init(k, a, b)
            base += [layer["w"].reshape(-1), layer["b"]]
        hl = self.lstm_hidden
        n_in = self.num_features + 1 + len(self.timescales) + ft.NUM_PROGRESS + ft.NUM_LOSS
        return {"lstm": lstm_init(keys[0], n_in, hl),
                "generator": jax.random.normal(keys[1], (hl, self.num_generated), jnp.float32) / hl ** 0.5,
                "w_base": jnp.concatenate(base), "w_lr": jnp.zeros((hl,), jnp.float32),
                "decays": factored.decay_logits(self.momentum_decays, self.rms_decay, self.adafactor_decays)}

    def opt_fn(self, theta: dict, *, num_steps: Optional[Any] = None,
               is_training: bool = False) -> optax.GradientTransformationExtraArgs:
        del is_training
        self.check_theta(theta, "HyperLOpt.opt_fn")
        n_mom, n_fac, hl = len(self.momentum_decays), len(self.adafactor_decays), self.lstm_hidden
        eps = self.spec().constants["eps"]

        def init_fn(params):
            n = len(jax.tree_util.tree_leaves(params))
            acc = factored.init_state(params, n_mom, n_fac)
            return HyperLOptState(acc, jnp.zeros((n, hl), jnp.float32), jnp.zeros((n, hl), jnp.float32),
                                  ft.init_loss_state())

        def update_fn(updates, state, params=None, *, loss=None, **extra_args):
            del extra_args
            tree_checks.require_params(updates, params, "HyperLOpt")
            acc_state = state.accumulators
            treedef, gs, (ps, ms, vs, rows, cols) = tree_checks.leaves_of(
                updates, params, acc_state.momenta, acc_state.rms, acc_state.fac_row, acc_state.fac_col)
            loss_f, loss_state = ft.loss_features(loss, state.loss_state)
            if not gs:
                return updates, state._replace(accumulators=acc_state._replace(iteration=acc_state.iteration + 1),
                                               loss_state=loss_state)
            dec = jax.tree_util.tree_map(jax.nn.sigmoid, theta["decays"])
            accs, feats, stats = [], [], []
            for g, p, m, v, row, col in zip(gs, ps, ms, vs, rows, cols):
                acc = factored.LeafAccum(m, v, row, col)
                if jnp.size(p) == 0:
                    accs.append(acc)
                    feats.append(None)
                    stats.append(jnp.ones((self.num_features,), jnp.float32))
                    continue
                g32, p32 = jnp.asarray(g, jnp.float32), jnp.asarray(p, jnp.float32)
                acc = factored.accumulate(g32, acc, dec["momentum"], dec["rms"][0], dec["adafactor"])
                accs.append(acc)
                feats.append(factored.leaf_features(g32, p32, acc))
                stats.append(factored.feature_mean_squares(g32, p32, acc, layout=self.update_layout))
            stats = jnp.stack(stats)                                                     # [L, F]
            ctx = ft.context_features(acc_state.iteration, self.timescales, num_steps, loss_f)
            z = ft.tensor_lstm_inputs(stats, ps, ctx)
            h, c = lstm_step(theta["lstm"], z, state.lstm_h, state.lstm_c)             # [L, H]
            weights = theta["w_base"] + (h @ theta["generator"]) * self.gen_scale        # [L, P]
            lr_mult = jnp.exp(h @ theta["w_lr"])

            new_u = []
            for i, (p, x) in enumerate(zip(ps, feats)):
                if x is None:
                    new_u.append(jnp.zeros_like(p))
                    continue
                layers = self._unflatten_mlp(weights[i])
                w1, b1 = layers[0]
                layers[0] = (w1 * jax.lax.rsqrt(stats[i] + eps)[:, None], b1)
                d, mag = elementwise_mlp(x, layers)
                step = d * jnp.exp(mag * self.exp_mult) * (self.step_mult * lr_mult[i])
                new_u.append(jnp.broadcast_to(-step, jnp.shape(p)).astype(jnp.result_type(p)))
            unf = treedef.unflatten
            new_acc = factored.AdafacState(*(unf([a[k] for a in accs]) for k in range(4)), acc_state.iteration + 1)
            return unf(new_u), HyperLOptState(new_acc, h, c, loss_state)

        return optax.GradientTransformationExtraArgs(init_fn, update_fn)

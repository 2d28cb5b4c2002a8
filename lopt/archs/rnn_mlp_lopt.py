"""RNNMLPLOpt: a per-tensor LSTM conditioning a per-parameter MLP (Metz et al. 2020).

Per tensor p (gradient g), float32 accumulators as in MLPLOpt:
    m_k ← β_k m_k + (1 − β_k) g   (k over `decays`)  [K, *p];   v ← β_v v + (1 − β_v) g²  [*p]
Per-parameter features x (F = K + 5): g, p, m_k, √v, g·v^{-½}, m_0.9·v^{-½}.

Each step, per tensor i, the LSTM (shared weights, own state (h_i, c_i) [H]) reads
    z_i = [log(mean(x_f²))/10 for f (F), log(1+numel)/10, step embedding (T), progress (3), loss (2)]
and emits h_i. From h_i come a conditioning vector added to the MLP's first hidden layer,
b_i = h_i W_cond, and a per-tensor step-size multiplier exp(h_i · w_lr). The per-parameter MLP
(`mlp_hidden` wide, ReLU) on the RMS-normalised x gives (d, m):

    Δp = −d · exp(m · exp_mult) · step_mult · exp(h_i · w_lr).

`loss=` is optional: without it the loss features are (0, 0) ("no loss"), see
`features.loss_features`. `num_steps=None` zeroes the progress features.
State: accumulators, the LSTM state stacked over tensors ([L, H], L = number of leaves in
the params' tree order), the loss EMA and the step count.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from lopt.parts import features as ft
from lopt.base import LearnedOptimizer, layout_option
from lopt.parts.moment_features import (MomentFeatures, accumulate, accumulator_fields, feature_names,
                                        feature_sum_squares, init_accumulators, leaf_features)
from lopt.parts.nn import dense_init, elementwise_mlp, lstm_fields, lstm_init, lstm_step
from lopt.parts.spec import ArchSpec, iteration_field
from lopt.parts import tree_checks


class RNNMLPLOptState(NamedTuple):
    """RNNMLPLOpt's optimizer state.

    Attributes:
      momenta: per leaf, float32 [K, *p.shape]: m_k.
      second_moment: per leaf, float32 [*p.shape]: v.
      lstm_h: float32 [L, H]: the LSTM's h, one row per leaf in the params' tree order.
      lstm_c: float32 [L, H]: the LSTM's c.
      loss_state: float32 [2]: the loss EMA and a seen flag (`features.loss_features`).
      iteration: int32 []: the number of updates so far.
    """
    momenta: Any
    second_moment: Any
    lstm_h: jax.Array
    lstm_c: jax.Array
    loss_state: jax.Array
    iteration: jax.Array


class RNNMLPLOpt(MomentFeatures, LearnedOptimizer):
    """Per-tensor LSTM over tensor statistics, loss and progress -> conditions a per-parameter MLP.

    The LSTM's inputs, the conditioning and the step Δp = −d · exp(m · exp_mult) · step_mult ·
    exp(h_i · w_lr) are in the module docstring. Theta: {"lstm": `lopt.parts.nn.lstm_init`,
    "w_cond" [H_lstm, H_mlp], "w_lr" [H_lstm], "input" / "hidden_i" / "output": the MLP's dense layers}.

    Args:
      lstm_hidden: H_lstm, the LSTM's state width.
      mlp_hidden: H_mlp, the width of the per-parameter MLP's hidden layers.
      mlp_layers: the number of hidden ReLU layers of the MLP (≥ 1).
      decays: the momentum decays β_k (K ≥ 1; F = K + 5 features).
      rms_decay: β_v of the second moment v.
      step_mult: the step's scale.
      exp_mult: the magnitude output's scale inside exp.
      timescales: τ of the step embedding tanh(t/τ − 1).
      layout: the update layout, "cpu" or "accelerator" (`lopt.base.layout_option`; speed only).
    """

    lstm_hidden: int = 16
    mlp_hidden: int = 8
    mlp_layers: int = 2
    decays: tuple[float, ...] = (0.5, 0.9, 0.99, 0.999)
    rms_decay: float = 0.999
    step_mult: float = 1e-3
    exp_mult: float = 1e-3
    timescales: tuple[float, ...] = ft.TIMESCALES
    layout: Any = layout_option()

    def check_config(self) -> None:
        if min(self.lstm_hidden, self.mlp_hidden, self.mlp_layers) < 1 or not self.decays:
            raise ValueError("RNNMLPLOpt needs positive sizes and at least one decay")

    @property
    def num_lstm_inputs(self) -> int:
        """The width of the LSTM's input z_i: F + 1 + T + 3 + 2."""
        return self.num_features + 1 + len(self.timescales) + ft.NUM_PROGRESS + ft.NUM_LOSS

    def spec(self) -> ArchSpec:
        """Its features, constants and state layout (`lopt.parts.spec`; read by `lopt.torch` too).

        Returns:
          features `moment_features.feature_names(K)`; constants "eps" (`features.EPS`); state
          "momenta", "second_moment", "lstm_h", "lstm_c" ([H] per tensor), "loss_state", "iteration".
        """
        return ArchSpec("RNNMLPLOpt", feature_names(len(self.decays)), {"eps": ft.EPS},
                        accumulator_fields(len(self.decays)) + lstm_fields(self.lstm_hidden)
                        + (ft.loss_state_field(), iteration_field()))

    def init(self, key: jax.Array) -> dict:
        keys = jax.random.split(key, self.mlp_layers + 3)
        h, hl = self.mlp_hidden, self.lstm_hidden
        theta = {"lstm": lstm_init(keys[0], self.num_lstm_inputs, hl),
                 "w_cond": jax.random.normal(keys[1], (hl, h), jnp.float32) * (0.1 / hl ** 0.5),
                 "w_lr": jnp.zeros((hl,), jnp.float32),
                 "input": dense_init(keys[2], self.num_features, h)}
        for i in range(1, self.mlp_layers):
            theta[f"hidden_{i}"] = dense_init(keys[2 + i], h, h)
        theta["output"] = dense_init(keys[-1], h, 2)
        return theta

    def opt_fn(self, theta: dict, *, num_steps: Optional[Any] = None,
               is_training: bool = False) -> optax.GradientTransformationExtraArgs:
        """The optimizer theta defines (the update is in the module docstring).

        Args:
          theta: meta-parameters, as from `init`.
          num_steps: the horizon N of the progress features (may be traced; None: unknown, the
            progress features are zero).
          is_training: accepted for the `LearnedOptimizer` interface and ignored: the update is the
            same while meta-training and after.

        Returns:
          An `optax.GradientTransformationExtraArgs`; its update reads `params` and, optionally, `loss`.
        """
        del is_training
        self.check_theta(theta, "RNNMLPLOpt.opt_fn")
        decays = jnp.asarray(self.decays, jnp.float32)
        hl, eps = self.lstm_hidden, self.spec().constants["eps"]

        def init_fn(params):
            n = len(jax.tree_util.tree_leaves(params))
            momenta, second_moment = init_accumulators(params, len(self.decays))
            return RNNMLPLOptState(
                momenta=momenta, second_moment=second_moment,
                lstm_h=jnp.zeros((n, hl), jnp.float32), lstm_c=jnp.zeros((n, hl), jnp.float32),
                loss_state=ft.init_loss_state(), iteration=jnp.zeros((), jnp.int32))

        def update_fn(updates, state, params=None, *, loss=None, **extra_args):
            del extra_args
            tree_checks.require_params(updates, params, "RNNMLPLOpt")
            treedef, gs, (ps, ms, vs) = tree_checks.leaves_of(updates, params, state.momenta, state.second_moment)
            loss_f, loss_state = ft.loss_features(loss, state.loss_state)
            ctx = ft.context_features(state.iteration, self.timescales, num_steps, loss_f)
            nfeat = self.num_features

            # phase 1: accumulators and per-tensor statistics
            accs, feats, stats = [], [], []
            for g, p, m, v in zip(gs, ps, ms, vs):
                if jnp.size(p) == 0:
                    accs.append((m, v))
                    feats.append(None)
                    stats.append(jnp.zeros((nfeat,), jnp.float32))
                    continue
                g32, p32 = jnp.asarray(g, jnp.float32), jnp.asarray(p, jnp.float32)
                m, v = accumulate(g32, m, v, decays, self.rms_decay)
                x = leaf_features(g32, p32, m, v, self.momentum_index)
                accs.append((m, v))
                feats.append(x)
                n = jnp.size(p)
                stats.append(feature_sum_squares(g32.reshape(-1), p32.reshape(-1), m.reshape(len(self.decays), n),
                                                 v.reshape(-1), self.momentum_index, self.update_layout) / n)
            if not gs:
                return updates, state._replace(iteration=state.iteration + 1, loss_state=loss_state)
            stats = jnp.stack(stats)                                                   # [L, F]
            z = ft.tensor_lstm_inputs(stats, ps, ctx)
            h, c = lstm_step(theta["lstm"], z, state.lstm_h, state.lstm_c)            # [L, H]
            cond = h @ theta["w_cond"]                                                 # [L, mlp_hidden]
            lr_mult = jnp.exp(h @ theta["w_lr"])                                       # [L]
            rest = [(theta[f"hidden_{i}"]["w"], theta[f"hidden_{i}"]["b"]) for i in range(1, self.mlp_layers)]
            rest.append((theta["output"]["w"], theta["output"]["b"]))

            # phase 2: the per-parameter MLP
            new_updates = []
            for i, (p, x) in enumerate(zip(ps, feats)):
                if x is None:
                    new_updates.append(jnp.zeros_like(p))
                    continue
                w1 = theta["input"]["w"] * jax.lax.rsqrt(stats[i] + eps)[:, None]
                d, mag = elementwise_mlp(x, [(w1, theta["input"]["b"] + cond[i])] + rest)
                step = d * jnp.exp(mag * self.exp_mult) * (self.step_mult * lr_mult[i])
                new_updates.append(jnp.broadcast_to(-step, jnp.shape(p)).astype(jnp.result_type(p)))
            unf = treedef.unflatten
            new_state = RNNMLPLOptState(unf([a[0] for a in accs]), unf([a[1] for a in accs]), h, c,
                                        loss_state, state.iteration + 1)
            return unf(new_updates), new_state

        return optax.GradientTransformationExtraArgs(init_fn, update_fn)

"""NNAdam: a per-tensor LSTM that sets each tensor's Adam hyper-parameters every step.

Per tensor i, the LSTM (shared weights, own state [H]) reads
    z_i = [log mean g², log mean m², log mean v, log mean p² (each /10, before this step's update),
           log(1+numel)/10, step embedding (T), progress (3), loss (2)]
and a linear head gives o_i = h_i W_out + b_out ∈ R⁴ (W_out initialised small, b_out = 0):

    lr_i = lr·exp(o_i0),  β1_i = σ(logit β1 + o_i1),  β2_i = σ(logit β2 + o_i2),  ε_i = ε·exp(o_i3).

Then Adam with per-tensor, per-step hyper-parameters; the bias corrections use the running
products of the betas actually applied, c1 ← c1·β1_i, c2 ← c2·β2_i:

    m ← β1 m + (1−β1) g,  v ← β2 v + (1−β2) g²,  Δp = −lr · (m/(1−c1)) / (√(v/(1−c2)) + ε).

With o = 0 this is exactly Adam(lr, β1, β2, ε). `loss=` is optional (loss features 0 without).
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from lopt.parts import features as ft
from lopt.base import LearnedOptimizer
from lopt.parts.nn import logit, lstm_fields, lstm_init, lstm_step
from lopt.parts.spec import PARAM, TENSOR, ArchSpec, StateField, iteration_field, reorder
from lopt.parts import tree_checks

# the per-tensor statistics the LSTM reads (before log_stat), in order: mean g², mean m², mean v, mean p²
STATS = ("mean_g2", "mean_m2", "mean_v", "mean_p2")
NUM_STATS = len(STATS)


class NNAdamState(NamedTuple):
    """NNAdam's optimizer state.

    Attributes:
      mu: per leaf, float32 [*p.shape]: Adam's first moment m.
      nu: per leaf, float32 [*p.shape]: Adam's second moment v.
      b1_prod: float32 [L]: c1 = Π β1 applied so far, per leaf (in the params' tree order).
      b2_prod: float32 [L]: c2 = Π β2 applied so far.
      lstm_h: the LSTM's hidden state h, float32 [L, H].
      lstm_c: the LSTM's cell state c, float32 [L, H].
      loss_state: `features.loss_features`' state, float32 [2].
      iteration: the step count, int32 [].
    """
    mu: Any
    nu: Any
    b1_prod: jax.Array
    b2_prod: jax.Array
    lstm_h: jax.Array
    lstm_c: jax.Array
    loss_state: jax.Array
    iteration: jax.Array


class NNAdam(LearnedOptimizer):
    """Adam whose lr, β1, β2, ε per tensor and step come from an LSTM over tensor statistics.

    The math is in the module docstring; with the head's output o = 0 it is Adam(learning_rate,
    b1, b2, eps). Theta: {"lstm": `lopt.parts.nn.lstm_init`, "output": {"w" [H, 4], "b" [4]}}.

    Args:
      lstm_hidden: H, the LSTM's state width.
      learning_rate: the base learning rate lr.
      b1: the base β1, in (0, 1).
      b2: the base β2, in (0, 1).
      eps: the base ε (> 0).
      output_scale: the std of the head's initial W_out is output_scale/√H (small: starts near Adam).
      timescales: τ of the step embedding tanh(t/τ − 1).
    """

    lstm_hidden: int = 16
    learning_rate: float = 1e-3
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    output_scale: float = 0.01
    timescales: tuple[float, ...] = ft.TIMESCALES

    def spec(self) -> ArchSpec:
        """Its features, constants and state layout (`lopt.parts.spec`; read by `lopt.torch` too).

        Returns:
          features `STATS` (the per-tensor statistics the LSTM reads first); no constants; state
          "mu", "nu" (like p), "b1_prod", "b2_prod" (one per tensor, 1 at init), "lstm_h", "lstm_c",
          "loss_state" and "iteration".
        """
        return ArchSpec("NNAdam", STATS, {}, (
            StateField("mu", PARAM, doc="m"), StateField("nu", PARAM, doc="v"),
            StateField("b1_prod", TENSOR, fill=1.0, doc="c1 = Π β1"), StateField("b2_prod", TENSOR, fill=1.0, doc="c2 = Π β2"),
            *lstm_fields(self.lstm_hidden), ft.loss_state_field(), iteration_field()))

    @property
    def num_lstm_inputs(self) -> int:
        """The width of the LSTM's input z_i: 4 statistics + 1 + T + 3 + 2."""
        return NUM_STATS + 1 + len(self.timescales) + ft.NUM_PROGRESS + ft.NUM_LOSS

    def init(self, key: jax.Array) -> dict:
        k1, k2 = jax.random.split(key)
        hl = self.lstm_hidden
        return {"lstm": lstm_init(k1, self.num_lstm_inputs, hl),
                "output": {"w": jax.random.normal(k2, (hl, 4), jnp.float32) * (self.output_scale / hl ** 0.5),
                           "b": jnp.zeros((4,), jnp.float32)}}

    def opt_fn(self, theta: dict, *, num_steps: Optional[Any] = None,
               is_training: bool = False) -> optax.GradientTransformationExtraArgs:
        del is_training
        self.check_theta(theta, "NNAdam.opt_fn")
        hl = self.lstm_hidden
        base = jnp.asarray([math.log(self.learning_rate), logit(self.b1), logit(self.b2), math.log(self.eps)],
                           jnp.float32)

        def init_fn(params):
            n = len(jax.tree_util.tree_leaves(params))
            return NNAdamState(jax.tree_util.tree_map(ft.zeros_like_f32, params),
                               jax.tree_util.tree_map(ft.zeros_like_f32, params),
                               jnp.ones((n,), jnp.float32), jnp.ones((n,), jnp.float32),
                               jnp.zeros((n, hl), jnp.float32), jnp.zeros((n, hl), jnp.float32),
                               ft.init_loss_state(), jnp.zeros((), jnp.int32))

        def update_fn(updates, state, params=None, *, loss=None, **extra_args):
            del extra_args
            tree_checks.require_params(updates, params, "NNAdam")
            treedef, gs, (ps, mus, nus) = tree_checks.leaves_of(updates, params, state.mu, state.nu)
            loss_f, loss_state = ft.loss_features(loss, state.loss_state)
            if not gs:
                return updates, state._replace(iteration=state.iteration + 1, loss_state=loss_state)
            ctx = ft.context_features(state.iteration, self.timescales, num_steps, loss_f)
            mean = lambda x: jnp.mean(x) if jnp.size(x) else jnp.zeros((), jnp.float32)
            mean_sq = lambda x: mean(jnp.square(jnp.asarray(x, jnp.float32)))
            order = self.spec().features
            stats = jnp.stack([jnp.stack(reorder([mean_sq(g), mean_sq(mu), mean(nu), mean_sq(p)],
                                                       ("mean_g2", "mean_m2", "mean_v", "mean_p2"), order))
                               for g, p, mu, nu in zip(gs, ps, mus, nus)])                     # [L, 4]
            z = ft.tensor_lstm_inputs(stats, ps, ctx)
            h, c = lstm_step(theta["lstm"], z, state.lstm_h, state.lstm_c)
            hp = base + h @ theta["output"]["w"] + theta["output"]["b"]                        # [L, 4]
            lr, b1, b2, eps = jnp.exp(hp[:, 0]), jax.nn.sigmoid(hp[:, 1]), jax.nn.sigmoid(hp[:, 2]), jnp.exp(hp[:, 3])
            b1_prod, b2_prod = state.b1_prod * b1, state.b2_prod * b2

            new_u, new_mu, new_nu = [], [], []
            for i, (g, p, mu, nu) in enumerate(zip(gs, ps, mus, nus)):
                g32 = jnp.asarray(g, jnp.float32)
                mu = b1[i] * mu + (1.0 - b1[i]) * g32
                nu = b2[i] * nu + (1.0 - b2[i]) * jnp.square(g32)
                m_hat, v_hat = mu / (1.0 - b1_prod[i]), nu / (1.0 - b2_prod[i])
                step = -lr[i] * m_hat / (jnp.sqrt(v_hat) + eps[i])
                new_u.append(step.astype(jnp.result_type(p)))
                new_mu.append(mu)
                new_nu.append(nu)
            unf = treedef.unflatten
            return unf(new_u), NNAdamState(unf(new_mu), unf(new_nu), b1_prod, b2_prod, h, c, loss_state,
                                           state.iteration + 1)

        return optax.GradientTransformationExtraArgs(init_fn, update_fn)

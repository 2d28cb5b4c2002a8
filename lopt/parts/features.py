"""Per-tensor and per-step features the learned optimizers read.

Conventions: optimizer state is float32 whatever the parameter dtype; a "tensor" is one leaf
of the params pytree; statistics "per tensor" reduce over every axis of that leaf.

- `step_embedding(t)`      tanh(t/τ − 1) for τ in timescales                      [T]
- `progress_features(t, N)` (min(t/N, 1), log1p(N)/10, 1) or zeros if N is None     [3]
- `loss_features(ℓ, s)`    (has_loss, tanh((ℓ − ℓ̄)/(|ℓ̄| + 1e-6)))                  [2]
- `context_features`, `tensor_lstm_inputs`: the inputs of the per-tensor LSTMs (RNNMLPLOpt,
  NNAdam, HyperLOpt)
- `EPS` (1e-8): added to a second moment before every square root / rsqrt of it
- `ADAM_EPS` (1e-8): ε of an Adam direction m̂ / (√v̂ + ε); `NORM_EPS` (1e-8): ε of a unit-RMS
  scaling u / (rms(u) + ε); `LOSS_DECAY` (0.9), `LOSS_EPS` (1e-6): the loss EMA's decay and the
  ε of its relative change; `LOG_EPS` (1e-12): the ε of `log_stat`
- `loss_state_field()`: the loss EMA's entry in an architecture's spec (`lopt.parts.spec`)

Where the blocks of per-parameter work come from: `lopt.parts.layout`; the checks of
`tx.update`'s inputs: `lopt.parts.tree_checks`; the schedules a learned step size multiplies:
`lopt.rules`.

The per-tensor RMS normalisation x_f / rms_f that the architectures apply to their features
is linear per feature, so they fold 1/rms_f into the rows of the first layer's weights:
(x ⊙ s) W = x (diag(s) W). That saves a whole pass over the [N, F] features.
"""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp

from lopt.parts.spec import STEP, StateField

TIMESCALES = (1, 3, 10, 30, 100, 300, 1000, 3000, 10000, 30000, 100000)
NUM_PROGRESS = 3
NUM_LOSS = 2
EPS = 1e-8
ADAM_EPS = 1e-8
NORM_EPS = 1e-8
LOSS_DECAY = 0.9
LOSS_EPS = 1e-6
LOG_EPS = 1e-12


def step_embedding(iteration: jax.Array, timescales: Sequence[float] = TIMESCALES) -> jax.Array:
    """tanh(t/τ − 1) for each τ: [T] float32."""
    t = jnp.asarray(iteration, jnp.float32)
    return jnp.tanh(t / jnp.asarray(timescales, jnp.float32) - 1.0)


def progress_features(iteration: jax.Array, num_steps: Optional[Any]) -> jax.Array:
    """Training-progress features [3]: (min(t/N, 1), log1p(N)/10, 1); zeros when N is None.

    `num_steps` may be a traced value (PES samples the horizon per particle)."""
    if num_steps is None:
        return jnp.zeros((NUM_PROGRESS,), jnp.float32)
    n = jnp.maximum(jnp.asarray(num_steps, jnp.float32), 1.0)
    t = jnp.asarray(iteration, jnp.float32)
    return jnp.stack([jnp.minimum(t / n, 1.0), jnp.log1p(n) / 10.0, jnp.ones((), jnp.float32)])


def loss_features(loss: Optional[Any], loss_state: jax.Array) -> tuple[jax.Array, jax.Array]:
    """([has_loss, tanh((ℓ − ℓ̄)/(|ℓ̄| + ε))], new loss_state), ε = `LOSS_EPS` (1e-6).

    loss_state = [ℓ̄, seen]: ℓ̄ an EMA (decay `LOSS_DECAY`, 0.9) of the loss started at the first loss seen.
    Without a loss (ℓ = None) both features are 0 and the state is unchanged, so architectures
    that read the loss still work in training loops that do not pass one."""
    if loss is None:
        return jnp.zeros((NUM_LOSS,), jnp.float32), loss_state
    loss = jnp.asarray(loss, jnp.float32).reshape(())
    ema = jnp.where(loss_state[1] > 0, loss_state[0], loss)
    rel = jnp.tanh((loss - ema) / (jnp.abs(ema) + LOSS_EPS))
    new_state = jnp.stack([LOSS_DECAY * ema + (1.0 - LOSS_DECAY) * loss, jnp.ones((), jnp.float32)])
    return jnp.stack([jnp.ones((), jnp.float32), rel]), new_state


def init_loss_state() -> jax.Array:
    """The loss state of `loss_features` before any loss was seen: [ℓ̄, seen] = [0, 0], float32 [2]."""
    return jnp.zeros(loss_state_field().dims, jnp.float32)


def loss_state_field() -> StateField:
    """The loss state's entry in an architecture's spec: "loss_state", float32 [2] per step."""
    return StateField("loss_state", STEP, (2,), doc="[loss EMA, seen], `loss_features`' state")


def rms(x: jax.Array) -> jax.Array:
    """The root-mean-square over every element of x: √mean(x²), float []."""
    return jnp.sqrt(jnp.mean(jnp.square(x)))


def zeros_like_f32(p: Any) -> jax.Array:
    """float32 zeros of p's shape: optimizer state is float32 whatever the parameter dtype."""
    return jnp.zeros(jnp.shape(p), jnp.float32)


def log_stat(x: jax.Array) -> jax.Array:
    """A scale-free summary for LSTM inputs: log(x + ε) / 10 (x ≥ 0, ε = `LOG_EPS`, 1e-12)."""
    return jnp.log(x + LOG_EPS) / 10.0


def context_features(iteration: jax.Array, timescales: Sequence[float], num_steps: Optional[Any],
                     loss_feats: jax.Array) -> jax.Array:
    """Inputs shared by every tensor's LSTM: [step embedding (T), progress (3), loss (2)]."""
    return jnp.concatenate([step_embedding(iteration, timescales), progress_features(iteration, num_steps), loss_feats])


def size_feature(p: Any) -> jax.Array:
    """log(1 + numel)/10: lets a per-tensor network tell a bias from a big matrix."""
    return jnp.asarray(math.log1p(math.prod(jnp.shape(p))) / 10.0, jnp.float32)


def tensor_lstm_inputs(stats: jax.Array, params: Sequence[Any], ctx: jax.Array) -> jax.Array:
    """Per-tensor LSTM inputs z [L, S + 1 + C]: [log_stat(stats) [L, S], size_feature [L, 1],
    the shared context ctx [C] repeated per tensor], for the L leaves `params`."""
    sizes = jnp.stack([size_feature(p) for p in params])[:, None]
    return jnp.concatenate([log_stat(stats), sizes, jnp.broadcast_to(ctx, (len(params), ctx.shape[0]))], axis=1)

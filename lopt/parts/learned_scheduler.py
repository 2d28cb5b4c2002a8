"""Celo's learned scheduler: an LSTM that reads training progress and the loss history and
outputs one step-size multiplier per step (Moudgil et al. 2025, "Celo").

Inputs, the same for every tensor of the model (so one LSTM state serves the whole model):

    frac = t / N                                    t the step (updates made before this one)
    progress_k = tanh(10 (frac − c_k))               c = `FRACTION_CENTRES` (9 values)
    loss_j                                           `loss_buffer_features` (9 values)
    x = [progress (9), loss (9)]                     [18]

The loss buffer (VeLO's) keeps EMAs of the loss at 10 half-lives spaced log-uniformly from 10
steps to N: decays δ_i = exp(−1/h_i), h = logspace(1, log10 N, 10). Each update first clips
the loss to 2|max_i ℓ̂_i| (ℓ̂ the bias-corrected EMAs before this loss; the loss itself at the
first step), then ℓ̄_i ← δ_i ℓ̄_i + (1 − δ_i) ℓ, ℓ̂_i = ℓ̄_i / (1 − δ_i^{n}) and the running
minimum μ_i ← min(μ_i, ℓ̂_i) (n losses seen). Its features compare each EMA with the next
longer one and the running minimum:

    loss_j = clip((ℓ̂_j − μ_j) / max(1e-8, ℓ̂_{j+1} − μ_j) − 1, −1, 1),   j = 1..9,   0 while n ≤ 2.

The network, hidden width H:

    z = x W_e + b_e + relu(x W_m + b_m)
    (h, c) ← LSTM(z, (h, c))                        `lopt.parts.nn.lstm_step`, from a learned
                                                     initial state (h_0, c_0)
    s = 0.1 · exp(h w_s + b_s)                       the step-size multiplier, a scalar

Theta: {"mix": dense [18, H], "embed": dense [18, H], "lstm": `lstm_init(H, H)` (it reads z),
"initial_state": {"h": [H], "c": [H]}, "step_size": dense [H, 1]}.
"""
from __future__ import annotations

from typing import Any

import flax
import jax
import jax.numpy as jnp

from lopt.parts.nn import dense_init, lstm_init, lstm_step
from lopt.parts.spec import STEP, StateField

FRACTION_CENTRES = (0.03, 0.1, 0.2, 0.4, 0.6, 0.8, 0.9, 1.0, 1.1)
NUM_LOSS_EMAS = 10
NUM_INPUTS = len(FRACTION_CENTRES) + NUM_LOSS_EMAS - 1  # 18
_FIRST_MIN = 999999999999.0  # the running minimum before any loss


@flax.struct.dataclass
class LossBufferState:
    """The loss EMAs of the scheduler's loss features.

    Attributes:
      means: the EMAs ℓ̄_i, float32 [10] (not bias-corrected).
      running_min: the running minimum μ_i of the bias-corrected EMAs, float32 [10].
      decays: δ_i, float32 [10] (fixed by the horizon N at init).
      count: the number of losses seen, int32 [].
    """
    means: jax.Array
    running_min: jax.Array
    decays: jax.Array
    count: jax.Array


@flax.struct.dataclass
class SchedulerState:
    """The learned scheduler's state.

    Attributes:
      loss_buffer: a `LossBufferState`.
      h: the LSTM's hidden state, float32 [1, H].
      c: the LSTM's cell state, float32 [1, H].
    """
    loss_buffer: LossBufferState
    h: jax.Array
    c: jax.Array


def state_fields(hidden: int) -> tuple[StateField, ...]:
    """The scheduler's state in an architecture's spec (`lopt.parts.spec`), one for the whole step.

    Args:
      hidden: H, the LSTM's width.

    Returns:
      "means", "running_min" [10] (torch: "loss_means", "loss_min"), "decays" [10] and "count" []
      (torch keeps neither: δ_i follow from the group's horizon, the count is the parameter's
      step), "h", "c" [1, H] (torch: "scheduler_h", "scheduler_c"; before the first update theta's
      initial_state, 0 for a fresh theta).
    """
    n = (NUM_LOSS_EMAS,)
    return (StateField("means", STEP, n, torch_name="loss_means", doc="the loss EMAs, not bias-corrected"),
            StateField("running_min", STEP, n, fill=_FIRST_MIN, torch_name="loss_min",
                       doc="the running minimum of the bias-corrected EMAs"),
            StateField("decays", STEP, n, torch_per_param=False, doc="δ_i = exp(−1/h_i), fixed by the horizon"),
            StateField("count", STEP, dtype="int32", torch_per_param=False, doc="the number of losses seen"),
            StateField("h", STEP, (1, hidden), torch_name="scheduler_h", doc="the LSTM's h"),
            StateField("c", STEP, (1, hidden), torch_name="scheduler_c", doc="the LSTM's c"))


def init_loss_buffer(num_steps: Any) -> LossBufferState:
    """The loss buffer before any loss, its half-lives spread from 10 steps to the horizon.

    Args:
      num_steps: the horizon N (an int or a traced int32 []).

    Returns:
      A `LossBufferState`: EMAs 0, running minimum 1e12, δ_i = exp(−1/h_i), h = logspace(1, log10 N, 10).
    """
    half_lives = jnp.logspace(1, jnp.log10(jnp.asarray(num_steps, jnp.int32)), NUM_LOSS_EMAS)
    return LossBufferState(jnp.zeros((NUM_LOSS_EMAS,), jnp.float32),
                           _FIRST_MIN * jnp.ones((NUM_LOSS_EMAS,), jnp.float32),
                           jnp.exp(-1.0 / half_lives), jnp.zeros((), jnp.int32))


def update_loss_buffer(state: LossBufferState, loss: jax.Array) -> LossBufferState:
    """One loss into the buffer: clipped to 2|max ℓ̂|, then the EMAs and running minimum (module docstring).

    Args:
      state: the buffer.
      loss: the training loss of this step, float32 [].

    Returns:
      The new buffer.
    """
    d = state.decays
    corrected = state.means / (1 - d ** (state.count + 1))
    approx_max = jnp.where(state.count == 0, loss, jnp.max(corrected))
    loss = jnp.minimum(jnp.abs(approx_max) * 2, loss)
    means = state.means * d + loss * (1.0 - d)
    corrected = means / (1 - d ** (state.count + 1))
    return LossBufferState(means, jnp.minimum(state.running_min, corrected), d, state.count + 1)


def loss_buffer_features(state: LossBufferState) -> jax.Array:
    """The 9 loss features of the module docstring, float32 [9] (0 while at most 2 losses were seen).

    Args:
      state: the buffer, after this step's loss.

    Returns:
      clip((ℓ̂_j − μ_j) / max(1e-8, ℓ̂_{j+1} − μ_j) − 1, −1, 1) for j = 1..9.
    """
    corrected = state.means / (1 - state.decays ** state.count)
    low = state.running_min[:-1]
    scale = jnp.maximum(1e-8, corrected[1:] - low)
    feats = jnp.clip((corrected[:-1] - low) / scale - 1.0, -1, 1)
    return jnp.where(state.count <= 2, feats * 0, feats)


def progress_embedding(iteration: jax.Array, num_steps: Any) -> jax.Array:
    """tanh(10 (t/N − c_k)) for the centres c_k of `FRACTION_CENTRES`, float32 [9].

    Args:
      iteration: t, the updates made before this one (int32 []).
      num_steps: the horizon N (int or traced int32 []).

    Returns:
      The progress embedding.
    """
    frac = iteration / jnp.asarray(jnp.asarray(num_steps, jnp.int32), jnp.float32)
    return jnp.tanh((frac - jnp.asarray(FRACTION_CENTRES, jnp.float32)) * 10)


def scheduler_init(key: jax.Array, hidden: int) -> dict:
    """Theta of the learned scheduler (random: a starting point for meta-training).

    The step-size head starts at zero weights, so the initial multiplier is s = 0.1 at every step.

    Args:
      key: PRNG key.
      hidden: H, the LSTM's width.

    Returns:
      The theta dict of the module docstring, float32.
    """
    k_mix, k_embed, k_lstm = jax.random.split(key, 3)
    return {"mix": dense_init(k_mix, NUM_INPUTS, hidden), "embed": dense_init(k_embed, NUM_INPUTS, hidden),
            "lstm": lstm_init(k_lstm, hidden, hidden),
            "initial_state": {"h": jnp.zeros((hidden,), jnp.float32), "c": jnp.zeros((hidden,), jnp.float32)},
            "step_size": {"w": jnp.zeros((hidden, 1), jnp.float32), "b": jnp.zeros((1,), jnp.float32)}}


def training_loss(loss: Any, name: str) -> jax.Array:
    """The training loss an update was given, as the scheduler reads it.

    Args:
      loss: the `loss=` argument of `update` (a scalar, or None when the caller passed none).
      name: the optimizer's name, for the error message.

    Returns:
      The loss as float32 [].

    Raises:
      ValueError: when no loss was given.
    """
    if loss is None:
        raise ValueError(f"{name}'s scheduler reads the training loss: call tx.update(grads, state, params, loss=loss)")
    return jnp.asarray(loss, jnp.float32).reshape(())


def init_state(theta: dict, num_steps: Any) -> SchedulerState:
    """The scheduler's state before the first step: an empty loss buffer and the learned initial LSTM state.

    Args:
      theta: the scheduler's theta.
      num_steps: the horizon N.

    Returns:
      A `SchedulerState`.
    """
    init = theta["initial_state"]
    return SchedulerState(init_loss_buffer(num_steps), jnp.asarray(init["h"], jnp.float32)[None],
                          jnp.asarray(init["c"], jnp.float32)[None])


@jax.jit
def step(theta: dict, state: SchedulerState, loss: jax.Array, iteration: jax.Array,
         num_steps: Any) -> tuple[jax.Array, SchedulerState]:
    """One step of the scheduler: the loss into the buffer, the LSTM on [progress, loss features].

    The loss features divide differences of nearly equal averages, so they amplify rounding:
    `step` is jitted, so that an eager update rounds as a jitted one does (when the update is
    jitted, this is inlined into it).

    Args:
      theta: the scheduler's theta.
      state: its state.
      loss: this step's training loss, float32 [].
      iteration: t, the updates made before this one (int32 []).
      num_steps: the horizon N.

    Returns:
      (s, the new state): s the step-size multiplier, float32 [].
    """
    buffer = update_loss_buffer(state.loss_buffer, loss)
    x = jnp.concatenate([progress_embedding(iteration, num_steps), loss_buffer_features(buffer)])[None]
    mixed = jax.nn.relu(x @ theta["mix"]["w"] + theta["mix"]["b"])
    z = x @ theta["embed"]["w"] + theta["embed"]["b"] + mixed
    h, c = lstm_step(theta["lstm"], z, state.h, state.c)
    multiplier = jnp.exp(jnp.squeeze(h @ theta["step_size"]["w"] + theta["step_size"]["b"])) * 0.1
    return multiplier, SchedulerState(buffer, h, c)

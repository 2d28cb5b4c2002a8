"""Tiny networks for learned optimizers, as pure functions of dict parameters.

- `dense_init`: a dense layer's {"w": W [in, out] ~ N(0, 1/in), "b": zeros [out]} (y = x W + b).
- `lstm_init` / `lstm_step`: a batched LSTM cell over per-tensor inputs x [L, in], state
  (h, c) [L, H]:  i, f, g, o = split(x Wx + h Wh + b);  c' = σ(f + 1) c + σ(i) tanh(g);
  h' = σ(o) tanh(c').
- `elementwise_mlp`: a per-parameter MLP with a *small* hidden size written as unrolled
  multiply-adds over per-feature arrays instead of a matmul, so XLA fuses the features, every
  layer and the output into one loop over the tensor (no [N, F] or [N, H] array is written).
- `per_param_mlp_init` / `shared_bias`: theta of the per-parameter MLP of MLPLOpt and
  AdafacMLPLOpt, whose first layer is split by input kind so that the inputs that are constant
  over a tensor (step embedding, progress) become one bias per tensor.
- `step_size_head_init` / `bounded_step_sizes`: a one-hidden-layer MLP from tensor-independent
  context (step embedding, progress, loss features) to step sizes bounded around a base,
  η = base · exp(range · tanh(s)) (NormMLPLOpt, Celo2LOpt).
- `logit`: the inverse of the sigmoid, for decays learned as β = σ(θ_β).
"""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp

from lopt import features as ft


def dense_init(key: jax.Array, fan_in: int, fan_out: int) -> dict:
    """A dense layer y = x W + b with W ~ N(0, 1/fan_in) and b = 0.

    Args:
      key: PRNG key for W.
      fan_in: input width.
      fan_out: output width.

    Returns:
      {"w": float32 [fan_in, fan_out], "b": float32 [fan_out]}.
    """
    w = jax.random.normal(key, (fan_in, fan_out), jnp.float32) * (1.0 / max(fan_in, 1) ** 0.5)
    return {"w": w, "b": jnp.zeros((fan_out,), jnp.float32)}


def lstm_init(key: jax.Array, in_size: int, hidden_size: int) -> dict:
    """Parameters of the LSTM cell of `lstm_step` (gates i, f, g, o stacked along the last axis).

    Args:
      key: PRNG key.
      in_size: input width.
      hidden_size: H, the width of the state h and c.

    Returns:
      {"wx": [in_size, 4H] ~ N(0, 1/in_size), "wh": [H, 4H] ~ N(0, 1/H), "b": zeros [4H]}, float32.
    """
    kx, kh = jax.random.split(key)
    return {"wx": jax.random.normal(kx, (in_size, 4 * hidden_size), jnp.float32) / max(in_size, 1) ** 0.5,
            "wh": jax.random.normal(kh, (hidden_size, 4 * hidden_size), jnp.float32) / hidden_size ** 0.5,
            "b": jnp.zeros((4 * hidden_size,), jnp.float32)}


def lstm_step(params: dict, x: jax.Array, h: jax.Array, c: jax.Array) -> tuple[jax.Array, jax.Array]:
    """One step of an LSTM cell, batched over L rows (one per tensor):

        i, f, g, o = split(x Wx + h Wh + b);  c' = σ(f + 1) c + σ(i) tanh(g);  h' = σ(o) tanh(c').

    Args:
      params: the cell's parameters, as from `lstm_init`.
      x: the inputs, float32 [L, in].
      h: the hidden state, float32 [L, H].
      c: the cell state, float32 [L, H].

    Returns:
      (h', c'), float32 [L, H] each.
    """
    gates = x @ params["wx"] + h @ params["wh"] + params["b"]
    i, f, g, o = jnp.split(gates, 4, axis=-1)
    c = jax.nn.sigmoid(f + 1.0) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
    return jax.nn.sigmoid(o) * jnp.tanh(c), c


def elementwise_mlp(features: Sequence[jax.Array], weights: Sequence[tuple[jax.Array, jax.Array]]) -> list[jax.Array]:
    """A ReLU MLP applied to every element, as unrolled multiply-adds.

    Cost: Σ in·out multiply-adds per element, all in one fused loop; meant for hidden sizes ≲ 8
    (a matmul is better for wider layers).

    Args:
      features: the F input arrays, broadcastable to one another (e.g. a tensor's features).
      weights: [(W [in, out], b [out]), ...], ReLU between layers, none after the last; the
        first layer's `in` must be F.

    Returns:
      The `out` output arrays of the last layer, each of the broadcast shape of `features`.
    """
    xs = list(features)
    for li, (w, b) in enumerate(weights):
        n_in, n_out = w.shape
        if n_in != len(xs):
            raise ValueError(f"layer {li} expects {n_in} inputs, got {len(xs)}")
        ys = []
        for j in range(n_out):
            acc = xs[0] * w[0, j]
            for f in range(1, n_in):
                acc = acc + xs[f] * w[f, j]
            acc = acc + b[j]
            ys.append(jax.nn.relu(acc) if li < len(weights) - 1 else acc)
        xs = ys
    return xs


def first_layer_init(key: jax.Array, n_feat: int, n_time: int, n_progress: int, hidden: int) -> dict:
    """A dense layer over [features (n_feat), step embedding (n_time), progress (n_progress)],
    its rows split by input kind.

    Args:
      key: PRNG key (one `dense_init` of n_feat + n_time + n_progress inputs).
      n_feat: number of per-parameter features.
      n_time: number of step-embedding values.
      n_progress: number of progress features (0: no `w_progress`).
      hidden: output width H.

    Returns:
      {"w": [n_feat, H], "w_time": [n_time, H], "b": [H]} and, if n_progress > 0,
      "w_progress": [n_progress, H].
    """
    first = dense_init(key, n_feat + n_time + n_progress, hidden)
    layer = {"w": first["w"][:n_feat], "w_time": first["w"][n_feat:n_feat + n_time], "b": first["b"]}
    if n_progress:
        layer["w_progress"] = first["w"][n_feat + n_time:]
    return layer


def per_param_mlp_init(key: jax.Array, n_feat: int, n_time: int, n_progress: int, hidden: int,
                       hidden_layers: int) -> dict:
    """Theta of a per-parameter MLP [features, step embedding, progress] -> hidden ×`hidden_layers` -> 2.

    Args:
      key: PRNG key.
      n_feat: number of per-parameter features.
      n_time: number of step-embedding values.
      n_progress: number of progress features (0 for none).
      hidden: hidden width H.
      hidden_layers: number of hidden layers (≥ 1).

    Returns:
      {"input": `first_layer_init(...)`, "hidden_i": dense [H, H] for i in 1..hidden_layers-1,
      "output": dense [H, 2]}.
    """
    keys = jax.random.split(key, hidden_layers + 1)
    theta = {"input": first_layer_init(keys[0], n_feat, n_time, n_progress, hidden)}
    for i in range(1, hidden_layers):
        theta[f"hidden_{i}"] = dense_init(keys[i], hidden, hidden)
    theta["output"] = dense_init(keys[-1], hidden, 2)
    return theta


def shared_bias(layer: dict, iteration: jax.Array, timescales: Sequence[float], num_steps: Optional[Any]) -> jax.Array:
    """The first layer's tensor-constant inputs folded into its bias: b + emb(t) W_time (+ progress(t, N) W_progress).

    Args:
      layer: a `first_layer_init` layer.
      iteration: the step t (int32 []).
      timescales: the step embedding's timescales (`features.step_embedding`).
      num_steps: the horizon N for `features.progress_features` (used only if the layer has
        `w_progress`; may be traced or None).

    Returns:
      The bias, float32 [H].
    """
    bias = layer["b"] + ft.step_embedding(iteration, timescales) @ layer["w_time"]
    if "w_progress" in layer:
        bias = bias + ft.progress_features(iteration, num_steps) @ layer["w_progress"]
    return bias


def logit(p: float) -> float:
    """log(p / (1 − p)), the inverse of the sigmoid: the unconstrained value of a learned β = σ(θ)."""
    return math.log(p) - math.log1p(-p)


def step_size_head_init(key: jax.Array, num_context: int, hidden: int, num_outputs: int) -> dict:
    """Theta of `bounded_step_sizes`: a ReLU hidden layer and a zero output layer (so η = base at init).

    Args:
      key: PRNG key of the hidden layer.
      num_context: C, the context's length.
      hidden: L, the hidden width.
      num_outputs: the number of step sizes.

    Returns:
      {"hidden": {"w" [C, L], "b" [L]}, "output": {"w" [L, num_outputs] = 0, "b" [num_outputs] = 0}}.
    """
    return {"hidden": dense_init(key, num_context, hidden),
            "output": {"w": jnp.zeros((hidden, num_outputs), jnp.float32), "b": jnp.zeros((num_outputs,), jnp.float32)}}


def bounded_step_sizes(head: dict, context: jax.Array, base: Any, log_range: float) -> jax.Array:
    """Learned step sizes bounded around `base`: η = base · exp(log_range · tanh(s)), s = MLP(context).

    Args:
      head: theta of `step_size_head_init`.
      context: float32 [C].
      base: the step sizes at s = 0 (a float, or float32 [num_outputs]).
      log_range: the bound of log(η / base) (> 0).

    Returns:
      float32 [num_outputs], each in [base · e^−log_range, base · e^log_range].
    """
    h = jax.nn.relu(context @ head["hidden"]["w"] + head["hidden"]["b"])
    s = h @ head["output"]["w"] + head["output"]["b"]
    return base * jnp.exp(log_range * jnp.tanh(s))

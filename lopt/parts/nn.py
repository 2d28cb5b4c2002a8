"""Tiny networks for learned optimizers, as pure functions of dict parameters.

- `dense_init`: a dense layer's {"w": W [in, out] ~ N(0, 1/in), "b": zeros [out]} (y = x W + b).
- `lstm_init` / `lstm_step` / `lstm_fields`: a batched LSTM cell over per-tensor inputs x [L, in], state
  (h, c) [L, H]:  i, f, g, o = split(x Wx + h Wh + b);  c' = σ(f + 1) c + σ(i) tanh(g);
  h' = σ(o) tanh(c').
- `elementwise_mlp`: a per-parameter MLP with a *small* hidden size written as unrolled
  multiply-adds over per-feature arrays instead of a matmul, so XLA fuses the features, every
  layer and the output into one loop over the tensor (no [N, F] or [N, H] array is written).
- `per_param_mlp_init` / `shared_bias`: theta of the per-parameter MLP of MLPLOpt and
  AdafacMLPLOpt, whose first layer is split by input kind so that the inputs that are constant
  over a tensor (step embedding, progress) become one bias per tensor.
- the step-size heads of NormMLPLOpt and Celo2LOpt: `lopt.parts.step_size`.
- `logit`: the inverse of the sigmoid, for decays learned as β = σ(θ_β).
"""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp

from lopt.parts import features as ft
from lopt.parts.spec import TENSOR, StateField


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


def lstm_fields(hidden_size: int) -> tuple[StateField, StateField]:
    """The per-tensor LSTM's state in an architecture's spec (`lopt.parts.spec`).

    Args:
      hidden_size: H.

    Returns:
      ("lstm_h", "lstm_c"): float32 [H] per tensor, zero before the first step (JAX stacks them, [L, H]).
    """
    return (StateField("lstm_h", TENSOR, (hidden_size,), doc="the LSTM's h"),
            StateField("lstm_c", TENSOR, (hidden_size,), doc="the LSTM's c"))


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


def residual_mlp_init(keys: Sequence[jax.Array], num_inputs: int, hidden: int, hidden_layers: int,
                      residual_init: float) -> dict:
    """Theta of a per-parameter ReLU MLP with one output that starts small (a learned residual).

    Args:
      keys: three PRNG keys: the input layer's, the hidden layers' (split once more) and the output layer's.
      num_inputs: the input width (the caller may split the input rows by kind afterwards).
      hidden: H, the hidden width.
      hidden_layers: the number of hidden ReLU layers (≥ 1).
      residual_init: the output layer's weights are `dense_init`'s times this.

    Returns:
      {"input": dense [num_inputs, H], "hidden_i": dense [H, H] for i in 1..hidden_layers-1,
      "output": dense [H, 1] with w × residual_init}.
    """
    k_in, k_hidden, k_out = keys
    mlp = {"input": dense_init(k_in, num_inputs, hidden)}
    for i, k in enumerate(jax.random.split(k_hidden, hidden_layers - 1), start=1):
        mlp[f"hidden_{i}"] = dense_init(k, hidden, hidden)
    out = dense_init(k_out, hidden, 1)
    mlp["output"] = {"w": out["w"] * residual_init, "b": out["b"]}
    return mlp


def later_layers(mlp: dict, hidden_layers: int) -> list[tuple[jax.Array, jax.Array]]:
    """[(W, b)] of an MLP's layers after the input layer: "hidden_1".."hidden_{L-1}", then "output".

    Args:
      mlp: theta of `residual_mlp_init` (or any MLP named so).
      hidden_layers: L, its number of hidden layers.

    Returns:
      The (weights, bias) pairs in order.
    """
    names = [f"hidden_{i}" for i in range(1, hidden_layers)] + ["output"]
    return [(mlp[name]["w"], mlp[name]["b"]) for name in names]

"""Tiny networks for learned optimizers, as pure functions of dict parameters.

- `dense_init` / `dense`: y = x W + b,  W [in, out] ~ N(0, scale²/in).
- `lstm_init` / `lstm_step`: a batched LSTM cell over per-tensor inputs x [L, in], state
  (h, c) [L, H]:  i, f, g, o = split(x Wx + h Wh + b);  c' = σ(f + 1) c + σ(i) tanh(g);
  h' = σ(o) tanh(c').
- `elementwise_mlp`: a per-parameter MLP with a *small* hidden size written as unrolled
  multiply-adds over per-feature arrays instead of a matmul, so XLA fuses the features, every
  layer and the output into one loop over the tensor (no [N, F] or [N, H] array is written).
"""
from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp


def dense_init(key: jax.Array, fan_in: int, fan_out: int, scale: float = 1.0) -> dict:
    w = jax.random.normal(key, (fan_in, fan_out), jnp.float32) * (scale / max(fan_in, 1) ** 0.5)
    return {"w": w, "b": jnp.zeros((fan_out,), jnp.float32)}




def lstm_init(key: jax.Array, in_size: int, hidden_size: int) -> dict:
    kx, kh = jax.random.split(key)
    return {"wx": jax.random.normal(kx, (in_size, 4 * hidden_size), jnp.float32) / max(in_size, 1) ** 0.5,
            "wh": jax.random.normal(kh, (hidden_size, 4 * hidden_size), jnp.float32) / hidden_size ** 0.5,
            "b": jnp.zeros((4 * hidden_size,), jnp.float32)}


def lstm_step(params: dict, x: jax.Array, h: jax.Array, c: jax.Array) -> tuple[jax.Array, jax.Array]:
    """One LSTM step. x [L, in], h, c [L, H] -> (h', c') [L, H]."""
    gates = x @ params["wx"] + h @ params["wh"] + params["b"]
    i, f, g, o = jnp.split(gates, 4, axis=-1)
    c = jax.nn.sigmoid(f + 1.0) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
    return jax.nn.sigmoid(o) * jnp.tanh(c), c


def elementwise_mlp(features: Sequence[jax.Array], weights: Sequence[tuple[jax.Array, jax.Array]]) -> list[jax.Array]:
    """A ReLU MLP applied to every element: features F arrays (broadcastable to the tensor),
    weights [(W [in, out], b [out]), ...] with ReLU between layers, none after the last.

    Returns the `out` output arrays of the last layer. Cost: Σ in·out multiply-adds per element,
    all in one fused loop; meant for hidden sizes ≲ 8 (a matmul is better for wider layers)."""
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

"""Tiny networks in torch (`lopt.parts.nn`): the per-tensor LSTM and the per-parameter MLP as GEMMs.

- `lstm_step`            `lopt.parts.nn.lstm_step` on [L, in] inputs
- `run_lstm`             one step of the LSTM, its state (h, c) kept in each parameter's state
- `mlp_columns`          a ReLU MLP on column-major features x [F, c] (`lopt.parts.nn.elementwise_mlp`'s
                         function, as GEMMs); `as_columns` turns JAX's dense layers into its layers
- `first_bias`           `lopt.parts.nn.shared_bias`: the first layer's bias from the step's context
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from lopt.torch.parts.layout import Workspace
from lopt.torch.rule import Context, Item

__all__ = ["lstm_step", "run_lstm", "mlp_columns", "as_columns", "first_bias"]


def lstm_step(params: dict, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One step of `lopt.parts.nn.lstm_step`: gates i, f, g, o = split(x Wx + h Wh + b);
    c' = σ(f + 1) c + σ(i) tanh(g); h' = σ(o) tanh(c').

    Args:
      params: {"wx" [in, 4H], "wh" [H, 4H], "b" [4H]}.
      x: [L, in].
      h: [L, H].
      c: [L, H].

    Returns:
      (h', c'), [L, H] each.
    """
    gates = x @ params["wx"] + h @ params["wh"] + params["b"]
    i, f, g, o = torch.chunk(gates, 4, dim=-1)
    c = torch.sigmoid(f + 1.0) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c), c


def run_lstm(lstm: dict, z: torch.Tensor, items) -> torch.Tensor:
    """One LSTM step over the items' rows, their "lstm_h" / "lstm_c" replaced; returns h [L, H]."""
    h0 = torch.stack([it.state["lstm_h"] for it in items])
    c0 = torch.stack([it.state["lstm_c"] for it in items])
    h, c = lstm_step(lstm, z, h0, c0)
    for i, it in enumerate(items):
        it.state["lstm_h"], it.state["lstm_c"] = h[i], c[i]
    return h


def mlp_columns(x: torch.Tensor, layers: Sequence[tuple[torch.Tensor, torch.Tensor]],
                ws: Optional[Workspace] = None) -> torch.Tensor:
    """A ReLU MLP on column-major features: h ← relu(Wᵀ h + b) per layer, no ReLU after the last.

    Args:
      x: [F, c], one column per parameter.
      layers: [(Wᵀ [out, in], b [out]), ...], the first layer's `in` F.
      ws: where the activations are written (None: fresh tensors); the result is then a
        workspace buffer, valid until the next call.

    Returns:
      [out, c] of the last layer.
    """
    h = x
    last = len(layers) - 1
    for i, (wt, b) in enumerate(layers):
        if ws is None:
            h = torch.addmm(b[:, None], wt, h)
        else:
            h = torch.addmm(b[:, None], wt, h, out=ws.get(f"mlp{i % 2}", (wt.shape[0], h.shape[1]), h.dtype, h.device))
        if i < last:
            h = torch.relu_(h)
    return h


def as_columns(layers: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """[(W [in, out], b)] (JAX's dense layers, y = x W + b) -> [(Wᵀ [out, in], b)] for `mlp_columns`."""
    return [(w.t().contiguous(), b) for w, b in layers]


def first_bias(layer: dict, ctx: Context, items: Sequence[Item], timescales: Sequence[float]) -> torch.Tensor:
    """`lopt.parts.nn.shared_bias` per item: b + emb(t) W_time (+ progress(t, N) W_progress), [L, H]."""
    bias = layer["b"] + ctx.embedding(timescales) @ layer["w_time"]
    if "w_progress" in layer:
        bias = bias + ctx.progress(items) @ layer["w_progress"]
    return bias

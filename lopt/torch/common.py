"""Torch building blocks shared by the update rules of `lopt.torch`, each mirroring a JAX helper of lopt.

They compute in the rule's compute dtype (float32, or float64 for float64 parameters) on the
parameters' device, batched over the L tensors of one step where the JAX optimizer batches over
its leaves:

- `step_embedding(t, τ)`  tanh(t/τ − 1)                               [L, T]   (`lopt.features`)
- `progress_features(t, N)` (min(t/N, 1), log1p(N)/10, 1), 0 if N None [L, 3]
- `loss_features(ℓ, s)`  (has_loss, tanh((ℓ − ℓ̄)/(|ℓ̄| + 1e-6))), the EMA state s [L, 2]
- `lstm_step`            `lopt.nn.lstm_step` on [L, in] inputs
- `mlp_columns`          a ReLU MLP on column-major features x [F, c] (`lopt.nn.elementwise_mlp`'s
                         function, as GEMMs)
- `chunks`, `chunk_rows`  the blocks a rule walks a big tensor in, so that its [F, c] features and
                         [H, c] activations stay small (no [n, F] array exists)
- `pow_f32`              β^t as the JAX float32 pow computes it (to within an ulp)
- `Workspace`            scratch tensors reused across blocks and steps, so that walking a tensor
                         allocates nothing per block

Everything here is device-agnostic: tensors are created on the inputs' device and dtype.
"""
from __future__ import annotations

import math
from typing import Iterator, Optional, Sequence

import torch

from lopt.features import EPS, NUM_PROGRESS

__all__ = ["EPS", "step_embedding", "progress_features", "loss_features", "lstm_step", "mlp_columns",
           "log_stat", "size_feature", "chunks", "chunk_rows", "pow_f32", "as_columns", "Workspace"]


def step_embedding(steps: torch.Tensor, timescales: Sequence[float]) -> torch.Tensor:
    """tanh(t/τ − 1) per step and timescale.

    Args:
      steps: t, [L] in the compute dtype.
      timescales: τ (T values).

    Returns:
      [L, T].
    """
    ts = torch.tensor(timescales, dtype=steps.dtype, device=steps.device)
    return torch.tanh(steps[:, None] / ts[None, :] - 1.0)


def progress_features(steps: torch.Tensor, horizons: Sequence[Optional[int]]) -> torch.Tensor:
    """(min(t/N, 1), log1p(N)/10, 1) per tensor, a zero row where its horizon N is None.

    Args:
      steps: t, [L].
      horizons: N per tensor (positive ints or None).

    Returns:
      [L, 3].
    """
    known = [h is not None for h in horizons]
    out = torch.zeros((steps.shape[0], NUM_PROGRESS), dtype=steps.dtype, device=steps.device)
    if not any(known):
        return out
    n = torch.tensor([float(h) if h is not None else 1.0 for h in horizons], dtype=steps.dtype, device=steps.device)
    n = torch.clamp(n, min=1.0)
    feats = torch.stack([torch.clamp(steps / n, max=1.0), torch.log1p(n) / 10.0, torch.ones_like(n)], dim=1)
    if all(known):
        return feats
    mask = torch.tensor(known, device=steps.device)
    return torch.where(mask[:, None], feats, out)


def loss_features(loss: Optional[torch.Tensor], states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`lopt.features.loss_features` for L tensors' loss states.

    Args:
      loss: the loss ℓ, a 0-d tensor in the compute dtype, or None (no loss: features 0, states kept).
      states: [L, 2], each row [ℓ̄, seen].

    Returns:
      (features [L, 2] = [has_loss, tanh((ℓ − ℓ̄)/(|ℓ̄| + 1e-6))], the new states [L, 2]).
    """
    if loss is None:
        return torch.zeros_like(states), states
    ema = torch.where(states[:, 1] > 0, states[:, 0], loss)
    rel = torch.tanh((loss - ema) / (torch.abs(ema) + 1e-6))
    ones = torch.ones_like(ema)
    return torch.stack([ones, rel], dim=1), torch.stack([0.9 * ema + 0.1 * loss, ones], dim=1)


def lstm_step(params: dict, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One step of `lopt.nn.lstm_step`: gates i, f, g, o = split(x Wx + h Wh + b);
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


def mlp_columns(x: torch.Tensor, layers: Sequence[tuple[torch.Tensor, torch.Tensor]],
                ws: Optional["Workspace"] = None) -> torch.Tensor:
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


def log_stat(x: torch.Tensor) -> torch.Tensor:
    """log(x + 1e-12) / 10, a scale-free summary for LSTM inputs (`lopt.features.log_stat`)."""
    return torch.log(x + 1e-12) / 10.0


def size_feature(numel: int) -> float:
    """log(1 + numel)/10 (`lopt.features.size_feature`), as a Python float."""
    return math.log1p(numel) / 10.0


def chunks(n: int, size: int) -> Iterator[tuple[int, int]]:
    """(start, end) of consecutive blocks of at most `size` elements covering [0, n)."""
    size = max(int(size), 1)
    for start in range(0, n, size):
        yield start, min(start + size, n)


def chunk_rows(shape: Sequence[int], size: int) -> Iterator[tuple[int, int]]:
    """(start, end) blocks of the first axis of a tensor of `shape` (ndim ≥ 1), each about `size`
    elements (at least one row)."""
    rows = shape[0]
    per_row = max(math.prod(shape[1:]), 1)
    return chunks(rows, max(size // per_row, 1))


def pow_f32(base: float, exponent: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """β^t as JAX computes `python_float ** float32_array`: β rounded to float32, the power taken
    in float64 and rounded (within an ulp of XLA's float32 pow); in float64 for a float64 dtype.

    Args:
      base: β.
      exponent: t, any shape.
      dtype: the compute dtype.

    Returns:
      β^t in `dtype`, shaped like `exponent`.
    """
    if dtype == torch.float64:
        return torch.pow(torch.tensor(base, dtype=torch.float64, device=exponent.device), exponent.double())
    b = torch.tensor(base, dtype=torch.float32, device=exponent.device).double()
    return torch.pow(b, exponent.double()).to(dtype)


class Workspace:
    """Scratch tensors reused across blocks, tensors and steps, one per name, device and dtype.

    `get` returns a view of a cached flat buffer (grown when a bigger one is asked for), so that a
    rule walking a big tensor block by block writes its features and activations into the same
    memory every time instead of allocating (and, for big tensors, page-faulting in) fresh tensors.
    A buffer is valid until the next `get` of the same name.
    """

    def __init__(self):
        self._buffers: dict = {}

    def get(self, name: str, shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A [*shape] tensor of `dtype` on `device` (uninitialised) backed by the buffer `name`."""
        n = math.prod(shape)
        key = (name, str(device), dtype)
        buf = self._buffers.get(key)
        if buf is None or buf.numel() < n:
            buf = self._buffers[key] = torch.empty((n,), dtype=dtype, device=device)
        return buf[:n].view(tuple(shape))

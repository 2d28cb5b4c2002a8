"""Per-step and per-tensor features in torch (`lopt.parts.features`), batched over the L tensors of one step.

They compute in the rule's compute dtype (float32, or float64 for float64 parameters) on the
inputs' device, where the JAX optimizer computes per leaf:

- `step_embedding(t, τ)`   tanh(t/τ − 1)                                          [L, T]
- `progress_features(t, N)` (min(t/N, 1), log1p(N)/10, 1), 0 if N None             [L, 3]
- `loss_features(ℓ, s)`    (has_loss, tanh((ℓ − ℓ̄)/(|ℓ̄| + ε))), the EMA state s [L, 2]
- `log_stat`, `size_feature`, `lstm_inputs`: the inputs of the per-tensor LSTMs (RNNMLPLOpt,
  NNAdam, HyperLOpt; `lopt.parts.features.tensor_lstm_inputs`)

Their constants (the loss EMA's decay and ε, log_stat's ε, the number of progress features) are
`lopt.parts.features`' public ones, read here, not restated.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

from lopt.parts.features import LOG_EPS, LOSS_DECAY, LOSS_EPS, NUM_PROGRESS

__all__ = ["step_embedding", "progress_features", "loss_features", "log_stat", "size_feature",
           "lstm_inputs"]


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
    """`lopt.parts.features.loss_features` for L tensors' loss states.

    Args:
      loss: the loss ℓ, a 0-d tensor in the compute dtype, or None (no loss: features 0, states kept).
      states: [L, 2], each row [ℓ̄, seen].

    Returns:
      (features [L, 2] = [has_loss, tanh((ℓ − ℓ̄)/(|ℓ̄| + ε))], the new states [L, 2]; ε = `LOSS_EPS`).
    """
    if loss is None:
        return torch.zeros_like(states), states
    ema = torch.where(states[:, 1] > 0, states[:, 0], loss)
    rel = torch.tanh((loss - ema) / (torch.abs(ema) + LOSS_EPS))
    ones = torch.ones_like(ema)
    return torch.stack([ones, rel], dim=1), torch.stack([LOSS_DECAY * ema + (1.0 - LOSS_DECAY) * loss, ones], dim=1)


def log_stat(x: torch.Tensor) -> torch.Tensor:
    """log(x + ε) / 10, a scale-free summary for LSTM inputs (`lopt.parts.features.log_stat`; ε = `LOG_EPS`)."""
    return torch.log(x + LOG_EPS) / 10.0


def size_feature(numel: int) -> float:
    """log(1 + numel)/10 (`lopt.parts.features.size_feature`), as a Python float."""
    return math.log1p(numel) / 10.0


def lstm_inputs(stats: torch.Tensor, items, ctx_feats: torch.Tensor) -> torch.Tensor:
    """`lopt.parts.features.tensor_lstm_inputs`: [log_stat(stats) [L, S], size [L, 1], context [L, C]]."""
    sizes = torch.tensor([[size_feature(it.param.numel())] for it in items], dtype=stats.dtype,
                         device=stats.device)
    return torch.cat([log_stat(stats), sizes, ctx_feats], dim=1)

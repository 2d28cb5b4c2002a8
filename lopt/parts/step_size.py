"""Learned step-size heads: a small MLP from tensor-independent context to bounded step sizes.

    z = [emb(t) (T), progress(t, N) (3), loss features (2)]          (`lopt.parts.features`)
    s = W₂ relu(W₁ z + b₁) + b₂                                       (W₂, b₂ start at zero)
    η = base · exp(log_range · tanh(s))  ∈ [base · e^−log_range, base · e^log_range]

A fresh head steps at exactly `base`; no theta moves η by more than e^log_range either way
(Celo's bounded learned step size; NormMLPLOpt and Celo2LOpt use it with two outputs).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp

from lopt.parts import features as ft
from lopt.parts.nn import dense_init


def context(iteration: jax.Array, timescales: Sequence[float], num_steps: Optional[Any],
            loss_feats: jax.Array) -> jax.Array:
    """The head's input z = [emb(t), progress(t, N), loss features]: float32 [T + 5].

    Args:
      iteration: t, int32 [].
      timescales: τ of the step embedding.
      num_steps: the horizon N (may be traced), or None (progress features zero).
      loss_feats: float32 [2], from `features.loss_features`.

    Returns:
      float32 [len(timescales) + NUM_PROGRESS + NUM_LOSS].
    """
    return jnp.concatenate([ft.step_embedding(iteration, timescales), ft.progress_features(iteration, num_steps),
                            loss_feats])


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


class LearnedStepSizes:
    """The learned step sizes of an architecture with a bounded step-size head (a mixin).

    The architecture declares the fields `timescales`, `use_num_steps`, `log_lr_range` and
    `lr_hidden_size` and a property `base_step_sizes` (float32 [S], the step sizes of a fresh
    theta); its theta holds the head under "lr" (`step_size_head_init(key, num_context,
    lr_hidden_size, S)`).
    """

    @property
    def num_context(self) -> int:
        """C = T + 5, the inputs of the step-size head (step embedding, progress, loss features)."""
        return len(self.timescales) + ft.NUM_PROGRESS + ft.NUM_LOSS

    def step_sizes(self, theta: dict, iteration: jax.Array, num_steps: Optional[Any], loss_feats: jax.Array):
        """The learned step sizes at step t: base_step_sizes · exp(log_lr_range · tanh(s)).

        Args:
          theta: meta-parameters (the head under "lr").
          iteration: t, int32 [].
          num_steps: the horizon N (may be traced or None); ignored unless `use_num_steps`.
          loss_feats: float32 [2], from `features.loss_features`.

        Returns:
          float32 [S].
        """
        z = context(iteration, self.timescales, num_steps if self.use_num_steps else None, loss_feats)
        return bounded_step_sizes(theta["lr"], z, self.base_step_sizes, self.log_lr_range)

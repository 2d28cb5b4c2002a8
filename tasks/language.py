"""Byte-level language models on a text DataSource ({"tokens": [B, L] uint8}, vocabulary 256).

Loss: mean next-byte cross-entropy,  −(1/(B(L−1))) Σ_{b,t} log p(tokens[b, t+1] | tokens[b, ≤t]).
Normaliser: loss / log 256 (an untrained model scores ~1), clipped at 1.5.
Models: a pre-LayerNorm causal transformer, and an LSTM.
"""
from __future__ import annotations

from typing import Any, Union

import haiku as hk
import jax
import jax.numpy as jnp

from tasks import registry
from tasks.base import (Task, TaskFamily, check_count, check_range, classification_normalizer, log_uniform,
                        softmax_cross_entropy)
from tasks.datasets.text import VOCAB_SIZE
from tasks.nets import scaled_init

MODELS = ("transformer", "lstm")


def _text_data(dataset: Union[str, Any], batch_size: int, what: str):
    check_count(batch_size, f"{what}: batch_size")
    data = registry.resolve_dataset(dataset, batch_size)
    spec = data.element_spec("train")
    if "tokens" not in spec or len(spec["tokens"].shape) != 2:
        raise ValueError(f"byte LMs need a DataSource with 'tokens' [B, L] (see tasks.datasets.byte_sequences), "
                         f"got {spec}")
    return data, int(spec["tokens"].shape[1])


def _transformer(tokens, *, d_model, num_heads, num_layers, init_scale):
    b, l = tokens.shape
    x = hk.Embed(VOCAB_SIZE, d_model, w_init=scaled_init(init_scale * 0.02 * d_model ** 0.5))(tokens)
    pos = hk.get_parameter("pos_embed", [l, d_model], init=scaled_init(init_scale * 0.02 * d_model ** 0.5))
    x = x + pos[None]
    mask = jnp.tril(jnp.ones((l, l), bool))[None, None]
    for _ in range(num_layers):
        h = hk.LayerNorm(-1, True, True)(x)
        h = hk.MultiHeadAttention(num_heads, d_model // num_heads, w_init=scaled_init(init_scale))(h, h, h, mask=mask)
        x = x + h
        h = hk.LayerNorm(-1, True, True)(x)
        h = hk.Linear(4 * d_model, w_init=scaled_init(init_scale))(h)
        x = x + hk.Linear(d_model, w_init=scaled_init(init_scale))(jax.nn.gelu(h))
    x = hk.LayerNorm(-1, True, True)(x)
    return hk.Linear(VOCAB_SIZE, w_init=scaled_init(0.1 * init_scale))(x)  # near-uniform initial predictions


def _lstm(tokens, *, embed_dim, hidden_size, init_scale):
    b = tokens.shape[0]
    x = hk.Embed(VOCAB_SIZE, embed_dim, w_init=scaled_init(init_scale))(tokens)
    core = hk.LSTM(hidden_size)
    h, _ = hk.dynamic_unroll(core, x, core.initial_state(b), time_major=False)
    return hk.Linear(VOCAB_SIZE, w_init=scaled_init(init_scale))(h)


class ByteLMTask(Task):
    """A byte-level LM; its loss and normaliser are in the module docstring.

    Args:
      dataset: a registered dataset name (e.g. "text:PATH") or a DataSource of {"tokens": [B, L]}.
      model: "transformer" (reads d_model, num_heads, num_layers) or "lstm" (reads embed_dim,
        hidden_size).
      batch_size: the batch size of a named dataset.
      d_model: the transformer's width (divisible by num_heads).
      num_heads: the transformer's attention heads.
      num_layers: the transformer's blocks.
      embed_dim: the LSTM's byte-embedding width.
      hidden_size: the LSTM's state width.
      init_scale: multiplies every initialiser's std (may be traced).
      name: the task's name (default: derived from the model and dataset).
    """

    def __init__(self, dataset: Union[str, Any], model: str = "transformer", *, batch_size: int = 16,
                 d_model: int = 32, num_heads: int = 2, num_layers: int = 1, embed_dim: int = 32,
                 hidden_size: int = 64, init_scale: Union[float, jax.Array] = 1.0, name: str | None = None):
        if model not in MODELS:
            raise ValueError(f"model must be one of {MODELS}, got {model!r}")
        if model == "transformer" and d_model % num_heads:
            raise ValueError(f"d_model={d_model} must be divisible by num_heads={num_heads}")
        self.data, self.seq_len = _text_data(dataset, batch_size, type(self).__name__)
        self.model = model
        if model == "transformer":
            fn = lambda t: _transformer(t, d_model=d_model, num_heads=num_heads, num_layers=num_layers,
                                        init_scale=init_scale)
        else:
            fn = lambda t: _lstm(t, embed_dim=embed_dim, hidden_size=hidden_size, init_scale=init_scale)
        self._net = hk.without_apply_rng(hk.transform(fn))
        self.name = name or f"byte_{model}_{self.data.name}"
        self.normalizer = classification_normalizer(VOCAB_SIZE)

    def init(self, key: jax.Array) -> hk.Params:
        return self._net.init(key, jnp.zeros((1, self.seq_len - 1), jnp.int32))

    def logits(self, params: hk.Params, tokens: jax.Array) -> jax.Array:
        """[B, L, 256] next-byte logits for int tokens [B, L]."""
        return self._net.apply(params, tokens.astype(jnp.int32))

    def loss(self, params: hk.Params, key: jax.Array, batch: dict) -> jax.Array:
        """Mean next-byte cross-entropy of batch["tokens"] [B, L] (predicting bytes 1..L−1)."""
        del key
        tokens = batch["tokens"].astype(jnp.int32)
        logits = self.logits(params, tokens[:, :-1])
        return softmax_cross_entropy(logits.reshape(-1, VOCAB_SIZE), tokens[:, 1:].reshape(-1))


class ByteTransformerTask(ByteLMTask):
    """A small causal transformer byte LM: ByteLMTask with model="transformer".

    Args:
      dataset: a registered dataset name or a DataSource of {"tokens": [B, L]}.
      **kwargs: ByteLMTask's keyword arguments.
    """

    def __init__(self, dataset: Union[str, Any], **kwargs):
        super().__init__(dataset, "transformer", **kwargs)


class ByteLSTMTask(ByteLMTask):
    """An LSTM byte LM: ByteLMTask with model="lstm".

    Args:
      dataset: a registered dataset name or a DataSource of {"tokens": [B, L]}.
      **kwargs: ByteLMTask's keyword arguments.
    """

    def __init__(self, dataset: Union[str, Any], **kwargs):
        super().__init__(dataset, "lstm", **kwargs)


class ByteLMFamily(TaskFamily):
    """Byte LMs of one architecture with per-task init scale (log-uniform):
    `sample(key)` -> {"init_scale": float32 []}.

    Args:
      dataset: a registered dataset name or a DataSource of {"tokens": [B, L]}.
      model: "transformer" or "lstm".
      batch_size: the batch size of a named dataset.
      init_scale_range: (lo, hi) of the log-uniform init scale.
      **model_kwargs: ByteLMTask's architecture arguments (d_model, num_heads, ...).
    """

    def __init__(self, dataset: Union[str, Any], model: str = "transformer", *, batch_size: int = 16,
                 init_scale_range: tuple[float, float] = (0.5, 2.0), **model_kwargs):
        self.init_scale_range = check_range(init_scale_range, "init_scale_range")
        self.model = model
        self.model_kwargs = dict(model_kwargs)
        self.data, _ = _text_data(dataset, batch_size, "ByteLMFamily")
        self.name = f"byte_{model}_family_{self.data.name}"

    def sample(self, key: jax.Array) -> dict:
        lo, hi = self.init_scale_range
        return {"init_scale": log_uniform(key, lo, hi)}

    def task_fn(self, cfg: dict) -> ByteLMTask:
        return ByteLMTask(self.data, self.model, init_scale=cfg["init_scale"], name=self.name, **self.model_kwargs)

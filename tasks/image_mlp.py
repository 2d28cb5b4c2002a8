"""Haiku MLP classifiers on image DataSources, and a family over their init scale/activation.

    logits = W_L · act(norm(W_{L-1} · … act(norm(W_1 · flatten(x))) …))

with optional LayerNorm or BatchNorm after each hidden layer. BatchNorm's running statistics
live in `model_state` (use `init_with_state` / `loss_with_state`).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import haiku as hk
import jax
import jax.numpy as jnp

from tasks.base import Task, classification_normalizer, softmax_cross_entropy
from tasks.datasets.data_source import as_float_images
from tasks.nets import ACTIVATIONS, ImageClassifierFamily, activation_fn, classification_data, scaled_init

NORMS = (None, "layer", "batch")


class ImageMLPTask(Task):
    """Cross-entropy of an MLP on flattened images: [B, H, W, C] -> hidden_sizes -> num_classes
    (the network is in the module docstring); normaliser loss / log(num_classes), clipped at 1.5.

    Params: haiku's {"linear": {"w", "b"}, "linear_1": ..., ...} (plus LayerNorm / BatchNorm
    scales and offsets); with norm="batch" the running statistics are the model_state.

    Args:
      dataset: a registered dataset name or a DataSource with "image" and integer "label".
      hidden_sizes: the widths of the hidden layers.
      activation: an activation name, or an int index (may be traced) into `activation_choices`.
      batch_size: the batch size of a named dataset.
      init_scale: multiplies the fan-in initialiser's std (may be traced).
      activation_choices: the names an index `activation` picks from.
      norm: None, "layer" or "batch": after each hidden linear layer, before the activation.
      name: the task's name (default: derived from the dataset, sizes and norm).
    """

    def __init__(self, dataset: Union[str, Any] = "digits", hidden_sizes: Sequence[int] = (32,), *,
                 activation: Union[str, jax.Array] = "relu", batch_size: int = 128,
                 init_scale: Union[float, jax.Array] = 1.0,
                 activation_choices: Sequence[str] = tuple(ACTIVATIONS), norm: Optional[str] = None,
                 name: str | None = None):
        if norm not in NORMS:
            raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")
        self.data, self._image_shape = classification_data(dataset, batch_size, "ImageMLPTask")
        self.hidden_sizes = tuple(int(h) for h in hidden_sizes)
        self.num_classes = int(self.data.num_classes)
        self.norm = norm
        act = activation_fn(activation, activation_choices)
        hidden, num_classes = self.hidden_sizes, self.num_classes

        def forward(images, is_training):
            x = hk.Flatten()(as_float_images(images))
            for size in hidden:
                x = hk.Linear(size, w_init=scaled_init(init_scale))(x)
                if norm == "layer":
                    x = hk.LayerNorm(-1, create_scale=True, create_offset=True)(x)
                elif norm == "batch":
                    x = hk.BatchNorm(True, True, decay_rate=0.9)(x, is_training)
                x = act(x)
            return hk.Linear(num_classes, w_init=scaled_init(init_scale))(x)

        self._net = hk.without_apply_rng(hk.transform_with_state(forward))
        suffix = f"_{norm}norm" if norm else ""
        self.name = name or f"image_mlp_{self.data.name}_{'x'.join(map(str, self.hidden_sizes))}{suffix}"
        self.normalizer = classification_normalizer(self.num_classes)

    def init_with_state(self, key: jax.Array) -> tuple[hk.Params, hk.State]:
        return self._net.init(key, jnp.zeros((1,) + self._image_shape, jnp.float32), True)

    def logits(self, params: hk.Params, images: jax.Array, model_state: Optional[hk.State] = None,
               is_training: bool = False) -> jax.Array:
        """[B, num_classes] logits; BatchNorm uses running statistics unless `is_training`."""
        if model_state is None:
            if self.norm == "batch":
                raise ValueError(f"{self.name} has BatchNorm: pass model_state to logits")
            model_state = {}
        return self._net.apply(params, model_state, images, is_training)[0]

    def loss_with_state(self, params, model_state, key, batch):
        del key
        logits, model_state = self._net.apply(params, model_state, batch["image"], True)
        return softmax_cross_entropy(logits, batch["label"]), model_state

    def loss(self, params: hk.Params, key: jax.Array, batch: dict) -> jax.Array:
        """Mean cross-entropy of the batch's labels (not for norm="batch": use `loss_with_state`)."""
        if self.norm == "batch":
            raise NotImplementedError(f"{self.name} has BatchNorm state: use init_with_state / loss_with_state")
        return self.loss_with_state(params, {}, key, batch)[0]


class ImageMLPFamily(ImageClassifierFamily):
    """Image MLPs with per-task init scale (log-uniform) and activation (uniform over choices):
    `sample(key)` -> {"init_scale": float32 [], "activation": int32 []}.

    Args:
      dataset: a registered dataset name or a DataSource with "image" and integer "label".
      hidden_sizes: the widths of the hidden layers.
      batch_size: the batch size of a named dataset.
      init_scale_range: (lo, hi) of the log-uniform init scale.
      activations: the activation names a task's activation is drawn from.
      norm: None, "layer" or "batch" (see ImageMLPTask).
    """

    def __init__(self, dataset: Union[str, Any] = "digits", hidden_sizes: Sequence[int] = (32,), *,
                 batch_size: int = 128, init_scale_range: tuple[float, float] = (0.5, 2.0),
                 activations: Sequence[str] = ("relu", "tanh", "gelu"), norm: Optional[str] = None):
        super().__init__(dataset, batch_size, init_scale_range, activations, "ImageMLPFamily")
        self.hidden_sizes = tuple(int(h) for h in hidden_sizes)
        self.norm = norm
        suffix = f"_{norm}norm" if norm else ""
        self.name = f"image_mlp_family_{self.dataset}_{'x'.join(map(str, self.hidden_sizes))}{suffix}"

    def task_fn(self, cfg: dict) -> ImageMLPTask:
        return ImageMLPTask(self.data, self.hidden_sizes, activation=cfg["activation"],
                            init_scale=cfg["init_scale"], activation_choices=self.activations,
                            norm=self.norm, name=self.name)

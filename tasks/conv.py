"""Small convnet classifiers on image DataSources (2-D images, or 1-D signals [B, L, C]).

    h_0 = x;  h_i = act(conv_{3, stride 2}(h_{i-1}))  for each entry of `channels`
    logits = W · mean_{spatial}(h_n)

The convolution rank follows the data: [B, H, W, C] -> 2-D, [B, L, C] -> 1-D.
"""
from __future__ import annotations

from typing import Any, Sequence, Union

import haiku as hk
import jax
import jax.numpy as jnp

from tasks.base import Task, TaskFamily, classification_normalizer, softmax_cross_entropy
from tasks.datasets.data_source import as_float_images
from tasks.image_mlp import (ACTIVATIONS, _activation_fn, check_family_args, classification_data,
                             sample_scale_and_activation, scaled_init)


class ConvTask(Task):
    """Cross-entropy of a strided convnet with global mean pooling; `init_scale` and
    `activation` (index into `activation_choices`) may be traced."""

    def __init__(self, dataset: Union[str, Any] = "digits", channels: Sequence[int] = (8, 16), *,
                 kernel_size: int = 3, stride: int = 2, activation: Union[str, jax.Array] = "relu",
                 batch_size: int = 128, init_scale: Union[float, jax.Array] = 1.0,
                 activation_choices: Sequence[str] = tuple(ACTIVATIONS), name: str | None = None):
        self.data, self._image_shape = classification_data(dataset, batch_size, "ConvTask")
        if len(self._image_shape) not in (2, 3):
            raise ValueError(f"ConvTask needs images [B, L, C] or [B, H, W, C], got {self._image_shape}")
        self.channels = tuple(int(c) for c in channels)
        self.num_classes = int(self.data.num_classes)
        spatial = len(self._image_shape) - 1
        act = _activation_fn(activation, activation_choices)
        chans, num_classes = self.channels, self.num_classes

        def forward(images):
            x = as_float_images(images)
            for c in chans:
                x = hk.ConvND(spatial, c, kernel_size, stride=stride, padding="SAME", w_init=scaled_init(init_scale))(x)
                x = act(x)
            x = jnp.mean(x, axis=tuple(range(1, 1 + spatial)))
            return hk.Linear(num_classes, w_init=scaled_init(init_scale))(x)

        self._net = hk.without_apply_rng(hk.transform(forward))
        self.name = name or f"conv_{self.data.name}_{'x'.join(map(str, self.channels))}"
        self.normalizer = classification_normalizer(self.num_classes)

    def init(self, key: jax.Array) -> hk.Params:
        return self._net.init(key, jnp.zeros((1,) + self._image_shape, jnp.float32))

    def logits(self, params: hk.Params, images: jax.Array) -> jax.Array:
        return self._net.apply(params, images)

    def loss(self, params: hk.Params, key: jax.Array, batch: dict) -> jax.Array:
        del key
        return softmax_cross_entropy(self.logits(params, batch["image"]), batch["label"])


class ConvFamily(TaskFamily):
    """Convnets with per-task init scale (log-uniform) and activation.

    Static config: dataset, channels, kernel_size, batch_size, activations.
    `sample(key)` -> {"init_scale": [], "activation": [] int32}.
    """

    def __init__(self, dataset: Union[str, Any] = "digits", channels: Sequence[int] = (8, 16), *,
                 kernel_size: int = 3, batch_size: int = 128, init_scale_range: tuple[float, float] = (0.5, 2.0),
                 activations: Sequence[str] = ("relu", "tanh", "gelu")):
        lo, hi = check_family_args(activations, init_scale_range)
        self.channels = tuple(int(c) for c in channels)
        self.kernel_size = int(kernel_size)
        self.batch_size = int(batch_size)
        self.init_scale_range = (float(lo), float(hi))
        self.activations = tuple(activations)
        self.data, _ = classification_data(dataset, batch_size, "ConvFamily")
        self.dataset = dataset if isinstance(dataset, str) else self.data.name
        self.name = f"conv_family_{self.dataset}_{'x'.join(map(str, self.channels))}"

    def sample(self, key: jax.Array) -> dict:
        return sample_scale_and_activation(key, self.init_scale_range, len(self.activations))

    def task_fn(self, cfg: dict) -> ConvTask:
        return ConvTask(self.data, self.channels, kernel_size=self.kernel_size, activation=cfg["activation"],
                        init_scale=cfg["init_scale"], activation_choices=self.activations, name=self.name)

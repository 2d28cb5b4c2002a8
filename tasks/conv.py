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

from tasks.base import Task, classification_normalizer, softmax_cross_entropy
from tasks.datasets.data_source import as_float_images
from tasks.nets import ACTIVATIONS, ImageClassifierFamily, activation_fn, classification_data, scaled_init


class ConvTask(Task):
    """Cross-entropy of a strided convnet with global mean pooling (the network is in the module
    docstring); normaliser loss / log(num_classes), clipped at 1.5.

    Args:
      dataset: a registered dataset name or a DataSource with "image" [B, H, W, C] or [B, L, C]
        and integer "label".
      channels: the output channels of each conv layer.
      kernel_size: the kernel's extent along every spatial axis.
      stride: the stride of every conv layer.
      activation: an activation name, or an int index (may be traced) into `activation_choices`.
      batch_size: the batch size of a named dataset.
      init_scale: multiplies the fan-in initialiser's std (may be traced).
      activation_choices: the names an index `activation` picks from.
      name: the task's name (default: derived from the dataset and channels).
    """

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
        act = activation_fn(activation, activation_choices)
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
        """[B, num_classes] logits of images [B, H, W, C] or [B, L, C] (uint8 or float)."""
        return self._net.apply(params, images)

    def loss(self, params: hk.Params, key: jax.Array, batch: dict) -> jax.Array:
        del key
        return softmax_cross_entropy(self.logits(params, batch["image"]), batch["label"])


class ConvFamily(ImageClassifierFamily):
    """Convnets with per-task init scale (log-uniform) and activation (uniform over choices):
    `sample(key)` -> {"init_scale": float32 [], "activation": int32 []}. Stride 2, as ConvTask's default.

    Args:
      dataset: a registered dataset name or a DataSource with "image" and integer "label".
      channels: the output channels of each conv layer.
      kernel_size: the kernel's extent along every spatial axis.
      batch_size: the batch size of a named dataset.
      init_scale_range: (lo, hi) of the log-uniform init scale.
      activations: the activation names a task's activation is drawn from.
    """

    def __init__(self, dataset: Union[str, Any] = "digits", channels: Sequence[int] = (8, 16), *,
                 kernel_size: int = 3, batch_size: int = 128, init_scale_range: tuple[float, float] = (0.5, 2.0),
                 activations: Sequence[str] = ("relu", "tanh", "gelu")):
        super().__init__(dataset, batch_size, init_scale_range, activations, "ConvFamily")
        self.channels = tuple(int(c) for c in channels)
        self.kernel_size = int(kernel_size)
        self.name = f"conv_family_{self.dataset}_{'x'.join(map(str, self.channels))}"

    def task_fn(self, cfg: dict) -> ConvTask:
        return ConvTask(self.data, self.channels, kernel_size=self.kernel_size, activation=cfg["activation"],
                        init_scale=cfg["init_scale"], activation_choices=self.activations, name=self.name)

"""Convnet classifiers with BatchNorm and dropout on image DataSources (2-D images, or 1-D signals [B, L, C]):
the most common vision model, with running statistics as model state.

    h_0 = x;  h_i = act(BN(conv_{k, stride 2}(h_{i-1})))   for each entry of `channels`
    logits = W · dropout_p(mean_{spatial}(h_n)) + b

Training (`loss_with_state`) normalises each BatchNorm by its batch's statistics and updates their
running means and variances (decay 0.9) in `model_state`, and drops each pooled feature with
probability p (inverted dropout: the kept ones scaled by 1 / (1 - p)), its randomness from the loss
key. Inference (`logits`, `eval_loss`) normalises by the running statistics and drops nothing, as a
trained model is used. The convolution rank follows the data: [B, H, W, C] -> 2-D, [B, L, C] -> 1-D.
"""
from __future__ import annotations

from typing import Any, Sequence, Union

import haiku as hk
import jax
import jax.numpy as jnp

from tasks.base import Task, classification_normalizer, softmax_cross_entropy
from tasks.datasets.data_source import as_float_images
from tasks.nets import ACTIVATIONS, ImageClassifierFamily, activation_fn, classification_data, scaled_init

BN_DECAY = 0.9


class ConvBNTask(Task):
    """Cross-entropy of a strided convnet with BatchNorm after each convolution and dropout before its
    linear head (the network is in the module docstring); normaliser loss / log(num_classes), clipped at 1.5.

    Params: haiku's conv kernels and biases, BatchNorm scales and offsets and the head; model_state: the
    BatchNorm running means and variances (`init_with_state`, `loss_with_state`).

    Args:
      dataset: a registered dataset name or a DataSource with "image" [B, H, W, C] or [B, L, C]
        and integer "label".
      channels: the output channels of each conv layer.
      kernel_size: the kernel's extent along every spatial axis.
      dropout: p, the probability of dropping a pooled feature in training, in [0, 1).
      activation: an activation name, or an int index (may be traced) into `activation_choices`.
      batch_size: the batch size of a named dataset.
      init_scale: multiplies the fan-in initialiser's std (may be traced).
      activation_choices: the names an index `activation` picks from.
      name: the task's name (default: derived from the dataset, channels and dropout).
    """

    def __init__(self, dataset: Union[str, Any] = "digits", channels: Sequence[int] = (8, 16), *,
                 kernel_size: int = 3, dropout: float = 0.1, activation: Union[str, jax.Array] = "relu",
                 batch_size: int = 128, init_scale: Union[float, jax.Array] = 1.0,
                 activation_choices: Sequence[str] = tuple(ACTIVATIONS), name: str | None = None):
        self.data, self._image_shape = classification_data(dataset, batch_size, "ConvBNTask")
        if len(self._image_shape) not in (2, 3):
            raise ValueError(f"ConvBNTask needs images [B, L, C] or [B, H, W, C], got {self._image_shape}")
        if not 0.0 <= float(dropout) < 1.0:
            raise ValueError(f"ConvBNTask: dropout must be in [0, 1), got {dropout!r}")
        self.channels = tuple(int(c) for c in channels)
        self.dropout = float(dropout)
        self.num_classes = int(self.data.num_classes)
        spatial = len(self._image_shape) - 1
        act = activation_fn(activation, activation_choices)
        chans, num_classes, rate = self.channels, self.num_classes, self.dropout

        def forward(images, is_training):
            x = as_float_images(images)
            for c in chans:
                x = hk.ConvND(spatial, c, kernel_size, stride=2, padding="SAME", w_init=scaled_init(init_scale))(x)
                x = act(hk.BatchNorm(True, True, decay_rate=BN_DECAY)(x, is_training))
            x = jnp.mean(x, axis=tuple(range(1, 1 + spatial)))
            if is_training and rate > 0:
                x = hk.dropout(hk.next_rng_key(), rate, x)
            return hk.Linear(num_classes, w_init=scaled_init(init_scale))(x)

        self._net = hk.transform_with_state(forward)
        drop = f"_drop{self.dropout:g}" if self.dropout else ""
        self.name = name or f"conv_bn_{self.data.name}_{'x'.join(map(str, self.channels))}{drop}"
        self.normalizer = classification_normalizer(self.num_classes)

    def init_with_state(self, key: jax.Array) -> tuple[hk.Params, hk.State]:
        return self._net.init(key, jnp.zeros((1,) + self._image_shape, jnp.float32), True)

    def logits(self, params: hk.Params, images: jax.Array, model_state: hk.State) -> jax.Array:
        """[B, num_classes] inference logits: BatchNorm by its running statistics, no dropout."""
        return self._net.apply(params, model_state, None, images, False)[0]

    def loss_with_state(self, params, model_state, key, batch):
        logits, model_state = self._net.apply(params, model_state, key, batch["image"], True)
        return softmax_cross_entropy(logits, batch["label"]), model_state

    def eval_loss(self, params: hk.Params, model_state: hk.State, key: jax.Array, batch: dict) -> jax.Array:
        """The inference loss: mean cross-entropy of `logits` (running statistics, no dropout).

        Args:
          params: the parameters.
          model_state: the BatchNorm running statistics.
          key: unused (inference is deterministic).
          batch: a batch with "image" and "label".

        Returns:
          A scalar.
        """
        del key
        return softmax_cross_entropy(self.logits(params, batch["image"], model_state), batch["label"])


class ConvBNFamily(ImageClassifierFamily):
    """BatchNorm + dropout convnets with per-task init scale (log-uniform) and activation (uniform over
    choices): `sample(key)` -> {"init_scale": float32 [], "activation": int32 []}. Stride 2.

    Args:
      dataset: a registered dataset name or a DataSource with "image" and integer "label".
      channels: the output channels of each conv layer.
      kernel_size: the kernel's extent along every spatial axis.
      dropout: the dropout probability before the head, in [0, 1).
      batch_size: the batch size of a named dataset.
      init_scale_range: (lo, hi) of the log-uniform init scale.
      activations: the activation names a task's activation is drawn from.
    """

    def __init__(self, dataset: Union[str, Any] = "digits", channels: Sequence[int] = (8, 16), *,
                 kernel_size: int = 3, dropout: float = 0.1, batch_size: int = 128,
                 init_scale_range: tuple[float, float] = (0.5, 2.0),
                 activations: Sequence[str] = ("relu", "tanh", "gelu")):
        super().__init__(dataset, batch_size, init_scale_range, activations, "ConvBNFamily")
        if not 0.0 <= float(dropout) < 1.0:
            raise ValueError(f"ConvBNFamily: dropout must be in [0, 1), got {dropout!r}")
        self.channels = tuple(int(c) for c in channels)
        self.kernel_size = int(kernel_size)
        self.dropout = float(dropout)
        drop = f"_drop{self.dropout:g}" if self.dropout else ""
        self.name = f"conv_bn_family_{self.dataset}_{'x'.join(map(str, self.channels))}{drop}"

    def task_fn(self, cfg: dict) -> ConvBNTask:
        return ConvBNTask(self.data, self.channels, kernel_size=self.kernel_size, dropout=self.dropout,
                          activation=cfg["activation"], init_scale=cfg["init_scale"],
                          activation_choices=self.activations, name=self.name)

    def static_configs(self) -> list[dict]:
        """What a compiled program of this family is specialised on (`tasks.suites.static_configs`), one per
        activation: {"kind": "conv_bn", "dataset", "batch_size", "channels", "kernel_size", "dropout",
        "activation"}; reads no dataset file."""
        return [{"kind": "conv_bn", "dataset": self.dataset, "batch_size": self.batch_size, "channels": self.channels,
                 "kernel_size": self.kernel_size, "dropout": self.dropout, "activation": a} for a in self.activations]

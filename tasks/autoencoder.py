"""MLP autoencoders on image DataSources: reconstruct each flattened image through a bottleneck.

    x  = flatten(image) ∈ R^D     (uint8 images / 255, in [0, 1]; float images as they are: digits in [0, 1])
    x̂  = W_L · act(W_{L-1} · … act(W_1 · x + b_1) … + b_{L-1}) + b_L      (a linear output of width D)
    L  = mean_{b, d} (x̂_bd − x_bd)²

e.g. hidden_sizes=(32, 8, 32) on 8x8 digits is the 64-32-8-32-64 autoencoder.

Trivial loss: the MSE of predicting, for every image, the per-pixel mean image m of the train
split, `mean_{i ∈ split, d} (m_d − x_id)²`; `AutoencoderTask.trivial_loss(split)` computes it from
the data, on the "test" split by default (where the suites measure the held-out loss), or on
"train" to compare with a final train loss. A trained autoencoder should end below it; one whose
hidden units all died ends at it at best, its output bias the mean image (digits: 0.0742 on test,
0.0731 on train).

Normaliser: loss / mean_{i ∈ train, d} x_id² (the loss of predicting zeros), clipped at 10, so an
untrained network at init scale 1 scores about 1 and the mean-image predictor 0.31 on digits.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Sequence, Union

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

from tasks import registry
from tasks.base import Task, TaskFamily, check_count, check_range, log_uniform, scaled_normalizer
from tasks.datasets.data_source import as_float_images
from tasks.nets import ACTIVATIONS, activation_fn, scaled_init


def image_data(dataset: Union[str, Any], batch_size: int, what: str) -> tuple[Any, tuple[int, ...]]:
    """Resolves `dataset` and checks that its batches hold images (labels, if any, are not used).

    Args:
      dataset: a registered dataset name (`tasks.registry`) or a DataSource with "image".
      batch_size: the batch size of a named dataset (a DataSource keeps its own); >= 1 either way.
      what: the caller's name, for error messages.

    Returns:
      (the DataSource, the shape of one image, e.g. (8, 8, 1)).
    """
    check_count(batch_size, f"{what}: batch_size")
    data = registry.resolve_dataset(dataset, batch_size)
    spec = data.element_spec("train")
    if "image" not in spec:
        raise ValueError(f"{what} needs a DataSource with 'image', got {sorted(spec)}")
    return data, tuple(spec["image"].shape[1:])


def _flat_split(data: Any, split: str) -> np.ndarray:
    """Every image of `split` as float64 [N, D] in the network's input scale (read on the host, so
    that no dataset array becomes a constant of a compiled program)."""
    if split not in data.splits:
        raise KeyError(f"DataSource {data.name!r} has no split {split!r}; it has {sorted(data.splits)}")
    images = np.asarray(data.splits[split]["image"])
    x = images.astype(np.float64) / 255.0 if np.issubdtype(images.dtype, np.integer) else images.astype(np.float64)
    return x.reshape(x.shape[0], -1)


class AutoencoderTask(Task):
    """Mean squared reconstruction error of an MLP autoencoder on flattened images (the network,
    loss, trivial loss and normaliser are in the module docstring).

    Params: haiku's {"linear": {"w", "b"}, "linear_1": ..., ...}, the last one the output layer.

    Args:
      dataset: a registered dataset name or a DataSource with "image" ([B, H, W, C] or [B, L, C]).
      hidden_sizes: the widths of the hidden layers, e.g. (32, 8, 32).
      activation: an activation name, or an int index (may be traced) into `activation_choices`.
      batch_size: the batch size of a named dataset.
      init_scale: multiplies the fan-in initialiser's std (may be traced).
      activation_choices: the names an index `activation` picks from.
      name: the task's name (default: derived from the dataset and sizes).
    """

    def __init__(self, dataset: Union[str, Any] = "digits", hidden_sizes: Sequence[int] = (32, 8, 32), *,
                 activation: Union[str, jax.Array] = "relu", batch_size: int = 64,
                 init_scale: Union[float, jax.Array] = 1.0, activation_choices: Sequence[str] = tuple(ACTIVATIONS),
                 name: str | None = None):
        self.data, self._image_shape = image_data(dataset, batch_size, "AutoencoderTask")
        self.hidden_sizes = tuple(int(h) for h in hidden_sizes)
        if not self.hidden_sizes or min(self.hidden_sizes) < 1:
            raise ValueError(f"AutoencoderTask: hidden_sizes must be one or more widths >= 1, got {hidden_sizes}")
        self.num_pixels = int(math.prod(self._image_shape))
        act = activation_fn(activation, activation_choices)
        hidden, num_pixels = self.hidden_sizes, self.num_pixels

        def reconstruct(images):
            x = hk.Flatten()(as_float_images(images))
            for size in hidden:
                x = act(hk.Linear(size, w_init=scaled_init(init_scale))(x))
            return hk.Linear(num_pixels, w_init=scaled_init(init_scale))(x)

        self._net = hk.without_apply_rng(hk.transform(reconstruct))
        self.name = name or f"autoencoder_{self.data.name}_{'x'.join(map(str, self.hidden_sizes))}"
        self.normalizer = scaled_normalizer(float(np.mean(np.square(_flat_split(self.data, "train")))))

    def init(self, key: jax.Array) -> hk.Params:
        return self._net.init(key, jnp.zeros((1,) + self._image_shape, jnp.float32))

    def reconstruct(self, params: hk.Params, images: jax.Array) -> jax.Array:
        """The reconstructions [B, D] of images [B, ...] (uint8 or float), flattened."""
        return self._net.apply(params, images)

    def loss(self, params: hk.Params, key: jax.Array, batch: dict) -> jax.Array:
        """Mean over the batch and the pixels of the squared reconstruction error."""
        del key
        images = batch["image"]
        target = as_float_images(images).reshape(images.shape[0], -1)
        return jnp.mean(jnp.square(self.reconstruct(params, images) - target))

    def trivial_loss(self, split: str = "test") -> float:
        """The loss of the best input-independent prediction: the train split's per-pixel mean image.

        Computed from the data (float64), over every example of `split`, not over sampled batches.

        Args:
          split: the split the prediction is scored on: "test" (default; the split whose loss
            the suites report after training) or "train" (to compare with final train losses).

        Returns:
          mean_{i ∈ split, d} (m_d − x_id)², m the per-pixel mean of the train split's images.
        """
        mean_image = _flat_split(self.data, "train").mean(axis=0)
        x = _flat_split(self.data, split)
        return float(np.mean(np.square(x - mean_image)))


class AutoencoderFamily(TaskFamily):
    """MLP autoencoders of one architecture with per-task init scale (log-uniform) and activation
    (uniform over `activations`): `sample(key)` -> {"init_scale": float32 [], "activation": int32 []}.

    Constructing a family reads no file: a named dataset loads on the first use of `data`.

    Args:
      dataset: a registered dataset name or a DataSource with "image".
      hidden_sizes: the widths of the hidden layers, e.g. (32, 8, 32).
      batch_size: the batch size of a named dataset (a DataSource keeps its own).
      init_scale_range: (lo, hi), 0 < lo ≤ hi, of the log-uniform init scale. Every layer's
        weights get it, so the initial output's scale goes as s^(number of layers): with the
        default, some tasks start far above the normaliser's scale (clipped at 10).
      activations: the activation names (keys of `tasks.nets.ACTIVATIONS`) a task's is drawn from.

    Attributes:
      dataset: the dataset's name (a DataSource's `name`).
      batch_size: the data's batch size.
    """

    def __init__(self, dataset: Union[str, Any] = "digits", hidden_sizes: Sequence[int] = (32, 8, 32), *,
                 batch_size: int = 64, init_scale_range: tuple[float, float] = (0.5, 2.0),
                 activations: Sequence[str] = ("relu",)):
        for a in activations:
            if a not in ACTIVATIONS:
                raise ValueError(f"unknown activation {a!r}; choose from {sorted(ACTIVATIONS)}")
        if not activations:
            raise ValueError("AutoencoderFamily: give at least one activation")
        self.init_scale_range = check_range(init_scale_range, "init_scale_range")
        self.activations = tuple(activations)
        self.hidden_sizes = tuple(int(h) for h in hidden_sizes)
        if isinstance(dataset, str):
            self.batch_size = check_count(batch_size, "AutoencoderFamily: batch_size")
            self.dataset = registry.check_dataset_name(dataset)
        else:  # a DataSource is already in memory: check it now
            self.data, _ = image_data(dataset, batch_size, "AutoencoderFamily")
            self.batch_size = int(self.data.batch_size)
            self.dataset = self.data.name
        self.name = f"autoencoder_family_{self.dataset}_{'x'.join(map(str, self.hidden_sizes))}"

    @functools.cached_property
    def data(self) -> Any:
        """The family's DataSource, loaded on first use."""
        return image_data(self.dataset, self.batch_size, "AutoencoderFamily")[0]

    def sample(self, key: jax.Array) -> dict:
        k1, k2 = jax.random.split(key)
        return {"init_scale": log_uniform(k1, *self.init_scale_range),
                "activation": jax.random.randint(k2, (), 0, len(self.activations))}

    def task_fn(self, cfg: dict) -> AutoencoderTask:
        return AutoencoderTask(self.data, self.hidden_sizes, activation=cfg["activation"],
                               init_scale=cfg["init_scale"], activation_choices=self.activations, name=self.name)

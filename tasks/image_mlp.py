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

from tasks import registry
from tasks.base import Task, TaskFamily, check_range, classification_normalizer, log_uniform, softmax_cross_entropy
from tasks.datasets.data_source import as_float_images

ACTIVATIONS = {"relu": jax.nn.relu, "tanh": jnp.tanh, "gelu": jax.nn.gelu, "swish": jax.nn.swish}
NORMS = (None, "layer", "batch")


def _activation_fn(activation: Union[str, jax.Array], choices: Sequence[str]):
    if isinstance(activation, str):
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; choose from {sorted(ACTIVATIONS)}")
        return ACTIVATIONS[activation]
    branches = [ACTIVATIONS[c] for c in choices]
    return lambda x: jax.lax.switch(activation, branches, x)


def scaled_init(scale: Union[float, jax.Array]) -> hk.initializers.Initializer:
    """Fan-in truncated-normal initialiser times `scale` (which may be traced)."""
    base = hk.initializers.VarianceScaling(1.0, "fan_in", "truncated_normal")
    return lambda shape, dtype: scale * base(shape, dtype)


def check_family_args(activations: Sequence[str], init_scale_range: tuple[float, float]) -> tuple[float, float]:
    """Validates a family's activation choices and init-scale range; returns the range as floats."""
    for a in activations:
        if a not in ACTIVATIONS:
            raise ValueError(f"unknown activation {a!r}; choose from {sorted(ACTIVATIONS)}")
    return check_range(init_scale_range, "init_scale_range")


def sample_scale_and_activation(key: jax.Array, init_scale_range: tuple[float, float], num_activations: int) -> dict:
    """{"init_scale": log-uniform [], "activation": uniform int32 index []} for a family's sample."""
    k1, k2 = jax.random.split(key)
    return {"init_scale": log_uniform(k1, *init_scale_range),
            "activation": jax.random.randint(k2, (), 0, num_activations)}


def classification_data(dataset: Union[str, Any], batch_size: int, task: str):
    """Resolves `dataset` (a name or a DataSource) and checks it has images and class labels."""
    data = registry.get_dataset(dataset, batch_size) if isinstance(dataset, str) else dataset
    spec = data.element_spec("train")
    if "image" not in spec or "label" not in spec:
        raise ValueError(f"{task} needs a DataSource with 'image' and 'label', got {sorted(spec)}")
    if data.num_classes is None:
        raise ValueError(f"{task} needs a DataSource with integer labels (num_classes), got {data.name!r}")
    return data, tuple(spec["image"].shape[1:])


class ImageMLPTask(Task):
    """Cross-entropy of an MLP on flattened images: [B, H, W, C] -> hidden_sizes -> num_classes.

    `init_scale` multiplies the variance-scaling initialiser's std; it and `activation` (an index
    into `activation_choices`) may be traced, which is how `ImageMLPFamily` samples them.
    `norm`: None, "layer" or "batch" (after each hidden linear layer, before the activation).
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
        act = _activation_fn(activation, activation_choices)
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
        if self.norm == "batch":
            raise NotImplementedError(f"{self.name} has BatchNorm state: use init_with_state / loss_with_state")
        return self.loss_with_state(params, {}, key, batch)[0]


class ImageMLPFamily(TaskFamily):
    """Image MLPs with per-task init scale (log-uniform) and activation (uniform over choices).

    Static config: dataset, hidden_sizes, batch_size, norm, activations.
    `sample(key)` -> {"init_scale": [], "activation": [] int32}.
    """

    def __init__(self, dataset: Union[str, Any] = "digits", hidden_sizes: Sequence[int] = (32,), *,
                 batch_size: int = 128, init_scale_range: tuple[float, float] = (0.5, 2.0),
                 activations: Sequence[str] = ("relu", "tanh", "gelu"), norm: Optional[str] = None):
        lo, hi = check_family_args(activations, init_scale_range)
        self.hidden_sizes = tuple(int(h) for h in hidden_sizes)
        self.batch_size = int(batch_size)
        self.init_scale_range = (float(lo), float(hi))
        self.activations = tuple(activations)
        self.norm = norm
        self.data, _ = classification_data(dataset, batch_size, "ImageMLPFamily")
        self.dataset = dataset if isinstance(dataset, str) else self.data.name
        suffix = f"_{norm}norm" if norm else ""
        self.name = f"image_mlp_family_{self.dataset}_{'x'.join(map(str, self.hidden_sizes))}{suffix}"

    def sample(self, key: jax.Array) -> dict:
        return sample_scale_and_activation(key, self.init_scale_range, len(self.activations))

    def task_fn(self, cfg: dict) -> ImageMLPTask:
        return ImageMLPTask(self.data, self.hidden_sizes, activation=cfg["activation"],
                            init_scale=cfg["init_scale"], activation_choices=self.activations,
                            norm=self.norm, name=self.name)

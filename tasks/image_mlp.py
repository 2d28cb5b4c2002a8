"""Haiku MLP classifiers on image DataSources, and a family over their init scale/activation."""
from __future__ import annotations

from typing import Any, Sequence, Union

import haiku as hk
import jax
import jax.numpy as jnp

from tasks import registry
from tasks.base import Task, TaskFamily, classification_normalizer, softmax_cross_entropy

ACTIVATIONS = {"relu": jax.nn.relu, "tanh": jnp.tanh, "gelu": jax.nn.gelu, "swish": jax.nn.swish}


def _activation_fn(activation: Union[str, jax.Array], choices: Sequence[str]):
    if isinstance(activation, str):
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; choose from {sorted(ACTIVATIONS)}")
        return ACTIVATIONS[activation]
    branches = [ACTIVATIONS[c] for c in choices]
    return lambda x: jax.lax.switch(activation, branches, x)


class ImageMLPTask(Task):
    """Cross-entropy of an MLP on flattened images: [B, H, W, C] -> hidden_sizes -> num_classes.

    `init_scale` multiplies the variance-scaling initialiser's std; it and `activation` (an index
    into `activation_choices`) may be traced, which is how `ImageMLPFamily` samples them.
    """

    def __init__(self, dataset: Union[str, Any] = "digits", hidden_sizes: Sequence[int] = (32,), *,
                 activation: Union[str, jax.Array] = "relu", batch_size: int = 128,
                 init_scale: Union[float, jax.Array] = 1.0,
                 activation_choices: Sequence[str] = tuple(ACTIVATIONS), name: str | None = None):
        self.data = registry.get_dataset(dataset, batch_size) if isinstance(dataset, str) else dataset
        self.hidden_sizes = tuple(int(h) for h in hidden_sizes)
        spec = self.data.element_spec("train")
        if "image" not in spec or "label" not in spec:
            raise ValueError(f"ImageMLPTask needs a DataSource with 'image' and 'label', got {sorted(spec)}")
        if self.data.num_classes is None:
            raise ValueError(f"ImageMLPTask needs a DataSource with integer labels (num_classes), got {self.data.name!r}")
        self.num_classes = int(self.data.num_classes)
        self._image_shape = spec["image"].shape[1:]
        act = _activation_fn(activation, activation_choices)
        sizes = self.hidden_sizes + (self.num_classes,)
        scale = init_scale

        def forward(images):
            x = hk.Flatten()(images)
            for i, size in enumerate(sizes):
                w_init = hk.initializers.VarianceScaling(1.0, "fan_in", "truncated_normal")
                x = hk.Linear(size, w_init=lambda s, d, w=w_init: scale * w(s, d))(x)
                if i < len(sizes) - 1:
                    x = act(x)
            return x

        self._net = hk.without_apply_rng(hk.transform(forward))
        self.name = name or f"image_mlp_{self.data.name}_{'x'.join(map(str, self.hidden_sizes))}"
        self.normalizer = classification_normalizer(self.num_classes)

    def init(self, key: jax.Array) -> hk.Params:
        return self._net.init(key, jnp.zeros((1,) + tuple(self._image_shape), jnp.float32))

    def logits(self, params: hk.Params, images: jax.Array) -> jax.Array:
        return self._net.apply(params, images)

    def loss(self, params: hk.Params, key: jax.Array, batch: dict) -> jax.Array:
        del key
        return softmax_cross_entropy(self.logits(params, batch["image"]), batch["label"])


class ImageMLPFamily(TaskFamily):
    """Image MLPs with per-task init scale (log-uniform) and activation (uniform over choices).

    `sample(key)` -> {"init_scale": [], "activation": [] int32}.
    """

    def __init__(self, dataset: str = "digits", hidden_sizes: Sequence[int] = (32,), *, batch_size: int = 128,
                 init_scale_range: tuple[float, float] = (0.5, 2.0),
                 activations: Sequence[str] = ("relu", "tanh", "gelu")):
        for a in activations:
            if a not in ACTIVATIONS:
                raise ValueError(f"unknown activation {a!r}; choose from {sorted(ACTIVATIONS)}")
        lo, hi = init_scale_range
        if not 0 < lo <= hi:
            raise ValueError(f"init_scale_range must satisfy 0 < lo <= hi, got {init_scale_range}")
        self.dataset = dataset
        self.hidden_sizes = tuple(int(h) for h in hidden_sizes)
        self.batch_size = int(batch_size)
        self.init_scale_range = (float(lo), float(hi))
        self.activations = tuple(activations)
        self.data = registry.get_dataset(dataset, batch_size)
        self.name = f"image_mlp_family_{dataset}_{'x'.join(map(str, self.hidden_sizes))}"

    def sample(self, key: jax.Array) -> dict:
        k1, k2 = jax.random.split(key)
        lo, hi = self.init_scale_range
        scale = jnp.exp(jax.random.uniform(k1, (), jnp.float32, jnp.log(lo), jnp.log(hi)))
        act = jax.random.randint(k2, (), 0, len(self.activations))
        return {"init_scale": scale, "activation": act}

    def task_fn(self, cfg: dict) -> ImageMLPTask:
        return ImageMLPTask(self.data, self.hidden_sizes, activation=cfg["activation"],
                            init_scale=cfg["init_scale"], activation_choices=self.activations,
                            name=self.name)

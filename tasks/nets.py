"""Pieces shared by the built-in haiku network tasks (image MLPs, convnets, byte LMs).

- `ACTIVATIONS` / `activation_fn`: activations by name, or by a (traced) index into a tuple of
  names, so a family can sample the activation per task without recompiling.
- `scaled_init`: the fan-in truncated-normal initialiser times a (traced) scale.
- `classification_data`: a dataset name or DataSource checked to hold images and class labels.
- `ImageClassifierFamily`: the base of image-classifier families, which sample an init scale
  (log-uniform) and an activation (uniform over the choices) per task; a named dataset is
  loaded on the first use of `family.data`, not when the family is built.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Sequence, Union

import haiku as hk
import jax
import jax.numpy as jnp

from tasks import registry
from tasks.base import TaskFamily, check_count, check_range, log_uniform

ACTIVATIONS = {"relu": jax.nn.relu, "tanh": jnp.tanh, "gelu": jax.nn.gelu, "swish": jax.nn.swish}


def activation_fn(activation: Union[str, jax.Array], choices: Sequence[str]) -> Callable[[jax.Array], jax.Array]:
    """The activation function `activation` names, or picks by index among `choices`.

    Args:
      activation: a key of `ACTIVATIONS`, or an int index (may be traced) into `choices`.
      choices: activation names; used only with an index (a `lax.switch` over them).

    Returns:
      The elementwise activation function.
    """
    if isinstance(activation, str):
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; choose from {sorted(ACTIVATIONS)}")
        return ACTIVATIONS[activation]
    branches = [ACTIVATIONS[c] for c in choices]
    return lambda x: jax.lax.switch(activation, branches, x)


def scaled_init(scale: Union[float, jax.Array]) -> hk.initializers.Initializer:
    """Fan-in truncated-normal initialiser (haiku's VarianceScaling(1, "fan_in")) times `scale`
    (which may be traced)."""
    base = hk.initializers.VarianceScaling(1.0, "fan_in", "truncated_normal")
    return lambda shape, dtype: scale * base(shape, dtype)


def classification_data(dataset: Union[str, Any], batch_size: int, task: str) -> tuple[Any, tuple[int, ...]]:
    """Resolves `dataset` and checks that its batches hold images and integer class labels.

    Args:
      dataset: a registered dataset name (`tasks.registry`) or a DataSource.
      batch_size: the batch size of a named dataset (a DataSource keeps its own); >= 1 either way.
      task: the caller's name, for error messages.

    Returns:
      (the DataSource, the shape of one image, e.g. (H, W, C) or (L, C)).
    """
    check_count(batch_size, f"{task}: batch_size")
    data = registry.resolve_dataset(dataset, batch_size)
    spec = data.element_spec("train")
    if "image" not in spec or "label" not in spec:
        raise ValueError(f"{task} needs a DataSource with 'image' and 'label', got {sorted(spec)}")
    if data.num_classes is None:
        raise ValueError(f"{task} needs a DataSource with integer labels (num_classes), got {data.name!r}")
    return data, tuple(spec["image"].shape[1:])


class ImageClassifierFamily(TaskFamily):
    """Base of the image-classifier families: the static dataset, batch size and activation
    choices, and a per-task init scale (log-uniform in `init_scale_range`) and activation
    (uniform over `activations`): `sample(key)` -> {"init_scale": float32 [], "activation": int32 []}.

    Constructing a family reads no file: its static description (`dataset`, `batch_size`, the
    architecture) is known without the data, which a named dataset loads on the first use of
    `data` (by `task_fn`, an estimator or a training loop). A missing dataset raises
    `tasks.datasets.DatasetNotFoundError` there, naming its files, the directories searched and
    how to get them; an unknown dataset name is refused at construction.

    Subclasses add their architecture and implement `task_fn`.

    Args:
      dataset: a registered dataset name or a DataSource with images and class labels.
      batch_size: the batch size of a named dataset (a DataSource keeps its own).
      init_scale_range: (lo, hi), 0 < lo ≤ hi, of the initialiser's scale.
      activations: the names (keys of `ACTIVATIONS`) a task's activation is drawn from.
      what: the subclass's name, for error messages.

    Attributes:
      dataset: the dataset's name (a DataSource's `name`).
      batch_size: the data's batch size.
    """

    def __init__(self, dataset: Union[str, Any], batch_size: int, init_scale_range: tuple[float, float],
                 activations: Sequence[str], what: str):
        for a in activations:
            if a not in ACTIVATIONS:
                raise ValueError(f"unknown activation {a!r}; choose from {sorted(ACTIVATIONS)}")
        self.init_scale_range = check_range(init_scale_range, "init_scale_range")
        self.activations = tuple(activations)
        self._what = what
        if isinstance(dataset, str):
            self.batch_size = check_count(batch_size, f"{what}: batch_size")
            self.dataset = registry.check_dataset_name(dataset)
        else:  # a DataSource is already in memory: check it now
            self.data, _ = classification_data(dataset, batch_size, what)
            self.batch_size = int(self.data.batch_size)
            self.dataset = self.data.name

    @functools.cached_property
    def data(self) -> Any:
        """The family's DataSource, loaded on first use (see the class docstring)."""
        return classification_data(self.dataset, self.batch_size, self._what)[0]

    def sample(self, key: jax.Array) -> dict:
        k1, k2 = jax.random.split(key)
        return {"init_scale": log_uniform(k1, *self.init_scale_range),
                "activation": jax.random.randint(k2, (), 0, len(self.activations))}

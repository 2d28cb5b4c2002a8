"""Wide MLPs on a few hundred noisily labelled examples: a family on which over-fitting is strong.

The training split keeps its first `num_train` examples, and a fraction `label_noise` of them get a
class drawn uniformly at random (fixed once, seeded: the same example always carries the same wrong
label); the other splits (inner_valid, outer_valid, test) keep their clean labels. A network wide
enough to memorise the training split then drives its training loss toward 0 while its loss on
held-out examples rises: the case where a held-out meta-loss and the training loss disagree, with a
known answer (decay or early stopping helps the held-out loss and hurts the training loss).
"""
from __future__ import annotations

import functools
from typing import Any, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np

from tasks.datasets.data_source import DataSource
from tasks.image_mlp import ImageMLPFamily
from tasks.nets import classification_data


def few_examples(data: DataSource, num_train: int, label_noise: float = 0.0, *, seed: int = 0) -> DataSource:
    """`data` with a training split of `num_train` examples, a fraction `label_noise` of them relabelled.

    Args:
      data: a DataSource with integer "label" (and `num_classes`).
      num_train: how many of the training split's examples to keep (its first ones), 1..its size.
      label_noise: the fraction in [0, 1] of the kept examples whose label is replaced by a class drawn
        uniformly (it may draw the true class again); fixed per example.
      seed: the seed of which examples are relabelled and of their new labels.

    Returns:
      A DataSource named "{name}_n{num_train}_noise{label_noise}" with the same batch size; the other
      splits are `data`'s, unchanged.
    """
    n = data.num_examples("train")
    if not 0 < int(num_train) <= n:
        raise ValueError(f"num_train must be in [1, {n}] (the training split of {data.name!r}), got {num_train}")
    if not 0.0 <= float(label_noise) <= 1.0:
        raise ValueError(f"label_noise must be a fraction in [0, 1], got {label_noise}")
    if data.num_classes is None:
        raise ValueError(f"few_examples needs integer labels (num_classes), {data.name!r} has none")
    num_train = int(num_train)
    train = {k: np.asarray(v)[:num_train] for k, v in data.splits["train"].items()}
    rng = np.random.default_rng(seed)
    flip = rng.random(num_train) < float(label_noise)
    labels = train["label"].copy()
    labels[flip] = rng.integers(0, data.num_classes, int(flip.sum()))
    train["label"] = labels.astype(train["label"].dtype)
    splits = dict(data.splits, train={k: jnp.asarray(v) for k, v in train.items()})
    return data.replace(splits=splits, name=f"{data.name}_n{num_train}_noise{float(label_noise):g}")


class SmallDataMLPFamily(ImageMLPFamily):
    """`ImageMLPFamily` on `few_examples` of a dataset (the module docstring): wide MLPs that over-fit.

    `sample(key)` -> {"init_scale": float32 [], "activation": int32 []} as ImageMLPFamily's.

    Args:
      dataset: a registered dataset name or a DataSource with "image" and integer "label".
      num_train: the training examples kept.
      label_noise: the fraction of them relabelled at random.
      hidden_sizes: the widths of the hidden layers.
      batch_size: the batch size of a named dataset.
      init_scale_range: (lo, hi) of the log-uniform init scale.
      activations: the activation names a task's activation is drawn from.
      seed: the seed of the relabelling.
    """

    def __init__(self, dataset: Union[str, Any] = "digits", num_train: int = 200, label_noise: float = 0.2, *,
                 hidden_sizes: Sequence[int] = (256,), batch_size: int = 32,
                 init_scale_range: tuple[float, float] = (1.0, 1.0), activations: Sequence[str] = ("relu",),
                 seed: int = 0):
        self.num_train, self.label_noise, self.seed = int(num_train), float(label_noise), int(seed)
        base = dataset if isinstance(dataset, str) else dataset.name
        if not isinstance(dataset, str):
            dataset = self._subset(classification_data(dataset, batch_size, "SmallDataMLPFamily")[0])
        super().__init__(dataset, hidden_sizes, batch_size=batch_size, init_scale_range=init_scale_range,
                         activations=activations)
        self.name = (f"small_data_mlp_family_{base}_n{self.num_train}"
                     f"_noise{self.label_noise:g}_{'x'.join(map(str, self.hidden_sizes))}")

    def _subset(self, data: DataSource) -> DataSource:
        return few_examples(data, self.num_train, self.label_noise, seed=self.seed)

    @functools.cached_property
    def data(self) -> DataSource:
        """The family's `few_examples` DataSource, loaded on first use (a named dataset)."""
        with jax.ensure_compile_time_eval():  # cached on the family: must not hold a trace's tracers
            return self._subset(classification_data(self.dataset, self.batch_size, "SmallDataMLPFamily")[0])

"""DataSource: a dataset held on the device, batched inside jit.

A DataSource is a pytree (a `flax.struct.dataclass`) whose leaves are the split arrays, so a
jitted function receives it as an argument — the arrays are never baked into the compiled
program as constants — and draws batches without a host round-trip:

    batch = data.batch(key, "train")   # {"image": [B, ...], "label": [B]}, same key -> same batch

Splits are disjoint subsets of the examples: train, inner_valid, outer_valid, test.
Batches are drawn uniformly with replacement from the split.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from tasks.base import check_count

SPLITS = ("train", "inner_valid", "outer_valid", "test")


@struct.dataclass
class DataSource:
    """Device-resident splits, batched inside jit (see the module docstring). A pytree: the split
    arrays are its leaves, the other fields static.

    Attributes:
      splits: {split name: a pytree (usually a dict) of arrays with a leading example axis}.
      batch_size: examples per batch (an integer >= 1; checked whenever a DataSource is built).
      name: a label (task names and error messages use it).
      num_classes: the number of classes of integer labels, or None.
    """

    splits: Mapping[str, Any]
    batch_size: int = struct.field(pytree_node=False)
    name: str = struct.field(pytree_node=False, default="data")
    num_classes: Optional[int] = struct.field(pytree_node=False, default=None)

    def __post_init__(self):
        check_count(self.batch_size, f"DataSource {self.name!r}: batch_size")

    def batch(self, key: jax.Array, split: str = "train") -> Any:
        """Draws `batch_size` examples of `split` with replacement. Jittable."""
        if split not in self.splits:
            raise KeyError(f"DataSource {self.name!r} has no split {split!r}; it has {sorted(self.splits)}")
        arrays = self.splits[split]
        n = self.num_examples(split)
        idx = jax.random.randint(key, (self.batch_size,), 0, n)
        return jax.tree_util.tree_map(lambda a: jnp.take(a, idx, axis=0), arrays)

    def num_examples(self, split: str) -> int:
        """The number of examples in `split`."""
        return int(jax.tree_util.tree_leaves(self.splits[split])[0].shape[0])

    def with_batch_size(self, batch_size: int) -> "DataSource":
        """The same splits (the same device arrays) with another batch size."""
        return self.replace(batch_size=int(batch_size))

    def element_spec(self, split: str = "train") -> Any:
        """Shapes/dtypes of one batch, as jax.ShapeDtypeStruct leaves."""
        return jax.tree_util.tree_map(
            lambda a: jax.ShapeDtypeStruct((self.batch_size,) + tuple(a.shape[1:]), a.dtype), self.splits[split]
        )


def split_fractions_to_counts(n: int, fractions: Sequence[float]) -> list[int]:
    """How many of `n` examples each split gets: floor(f · n) each, the remainder to train.

    Args:
      n: the number of examples.
      fractions: one non-negative fraction per split of SPLITS, summing to 1.

    Returns:
      The counts, in the order of SPLITS; ValueError if a split with a positive fraction gets none.
    """
    if len(fractions) != len(SPLITS):
        raise ValueError(f"need one fraction per split {SPLITS}, got {fractions}")
    if any(f < 0 for f in fractions) or abs(sum(fractions) - 1.0) > 1e-6:
        raise ValueError(f"split fractions must be non-negative and sum to 1, got {fractions}")
    counts = [int(np.floor(f * n)) for f in fractions]
    counts[0] += n - sum(counts)  # the remainder goes to train
    if any(c == 0 for c, f in zip(counts, fractions) if f > 0):
        raise ValueError(f"{n} examples are too few for split fractions {fractions}")
    return counts


def from_arrays(
    arrays: Mapping[str, np.ndarray],
    batch_size: int,
    *,
    fractions: Sequence[float] = (0.6, 0.1, 0.1, 0.2),
    seed: int = 0,
    name: str = "data",
    presplit: Optional[Mapping[str, Mapping[str, np.ndarray]]] = None,
    label_key: str = "label",
) -> DataSource:
    """Builds a DataSource by a seeded, disjoint shuffle-split of `arrays` (all of length N).

    With `presplit` (e.g. a dataset's official test set), `presplit[name]` is used as that
    split verbatim and the remaining fractions are renormalised over `arrays`; its arrays must
    have the keys and the per-example shapes of `arrays`. Integer labels (`label_key`) are class
    indices: `num_classes = max label + 1`, and a negative label is an error.
    """
    arrays = {k: np.asarray(v) for k, v in arrays.items()}
    lengths = {k: v.shape[0] for k, v in arrays.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"all arrays need the same number of examples, got {lengths}")
    n = next(iter(lengths.values()))
    presplit = dict(presplit or {})
    unknown = set(presplit) - set(SPLITS)
    if unknown:
        raise ValueError(f"unknown split names {sorted(unknown)}; splits are {SPLITS}")
    for split, given in presplit.items():
        if set(given) != set(arrays):
            raise ValueError(f"{name}: the {split!r} split has arrays {sorted(given)}, the others {sorted(arrays)}")
        for k, v in given.items():
            if np.shape(v)[1:] != arrays[k].shape[1:]:
                raise ValueError(f"{name}: the {split!r} split's {k!r} examples have shape {np.shape(v)[1:]} but "
                                 f"the other splits' have {arrays[k].shape[1:]}; are they of the same dataset?")
    fr = [0.0 if s in presplit else f for s, f in zip(SPLITS, fractions)]
    total = sum(fr)
    fr = [f / total for f in fr]
    counts = split_fractions_to_counts(n, fr)
    perm = np.random.default_rng(seed).permutation(n)
    splits, start = {}, 0
    for s, c in zip(SPLITS, counts):
        if s in presplit:
            splits[s] = {k: jnp.asarray(np.asarray(v)) for k, v in presplit[s].items()}
            continue
        idx = perm[start : start + c]
        start += c
        splits[s] = {k: jnp.asarray(v[idx]) for k, v in arrays.items()}
    num_classes = None
    if label_key in arrays and np.issubdtype(arrays[label_key].dtype, np.integer):  # integer labels: classes
        all_labels = {f"the {s!r} split's": np.asarray(p[label_key]) for s, p in presplit.items()}
        all_labels["the"] = arrays[label_key]
        for where, labels in all_labels.items():
            if labels.size and int(labels.min()) < 0:
                raise ValueError(f"{name}: integer labels are class indices and must be >= 0, but {where} "
                                 f"{label_key!r} array holds {int(labels.min())}")
        num_classes = int(max(int(l.max()) for l in all_labels.values() if l.size)) + 1
    return DataSource(splits=splits, batch_size=int(batch_size), name=name, num_classes=num_classes)


def as_float_images(images: jax.Array) -> jax.Array:
    """uint8 images in [0, 255] -> float32 in [0, 1]; float images pass through as float32."""
    if jnp.issubdtype(images.dtype, jnp.integer):
        return images.astype(jnp.float32) / 255.0
    return images.astype(jnp.float32)

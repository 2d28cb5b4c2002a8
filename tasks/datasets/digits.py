"""scikit-learn's bundled 8x8 digits (1797 images, 10 classes): real data with no download."""
from __future__ import annotations

import functools

import numpy as np

from tasks.datasets.data_source import DataSource, from_arrays


@functools.lru_cache(maxsize=4)
def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    d = load_digits()
    images = (d.images.astype(np.float32) / 16.0)[..., None]  # [1797, 8, 8, 1] in [0, 1]
    return images, d.target.astype(np.int32)


def digits(batch_size: int = 128, *, seed: int = 0) -> DataSource:
    """Digits as a DataSource: {"image": [B, 8, 8, 1] float32 in [0, 1], "label": [B] int32}.

    Splits (seeded, disjoint): 60% train, 10% inner_valid, 10% outer_valid, 20% test.
    """
    images, labels = _digits_arrays()
    return from_arrays({"image": images, "label": labels}, batch_size, seed=seed, name="digits")

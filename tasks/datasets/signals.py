"""Procedural 1-D signal classification (in the spirit of MNIST-1D): no files, built in ms.

Each class is a fixed 1-D template (a bump, a step, a ramp, ...). An example of class k is

    s(t) = a · resample(template_k, width w) placed at offset o  +  b · (t − t̄)  +  σ·ε  +  smooth noise

with amplitude a, width w, offset o, shear b drawn per example, white noise ε and a smoothed
random walk. Position and width vary, so a model must find the shape, not memorise pixels.
Batch: {"image": [B, length, 1] float32, "label": [B] int32} — a 1-D "image" that MLPs flatten
and convnets treat with 1-D convolutions.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from tasks.datasets.data_source import DataSource, from_arrays

NUM_TEMPLATE_POINTS = 16


def templates() -> np.ndarray:
    """The 10 class templates, [10, 16], each scaled to max |value| = 1."""
    t = np.linspace(0.0, 1.0, NUM_TEMPLATE_POINTS)
    shapes = [
        np.exp(-((t - 0.5) / 0.15) ** 2),                          # 0 bump
        (t > 0.5).astype(float),                                   # 1 step up
        1.0 - np.abs(2 * t - 1),                                   # 2 triangle
        2 * t - 1,                                                 # 3 ramp
        np.exp(-((t - 0.25) / 0.1) ** 2) + np.exp(-((t - 0.75) / 0.1) ** 2),  # 4 two bumps
        -np.exp(-((t - 0.5) / 0.2) ** 2),                          # 5 dip
        np.sin(2 * np.pi * t),                                     # 6 one period
        np.sin(4 * np.pi * t),                                     # 7 two periods
        np.where(t < 0.5, -1.0, 1.0) * (np.abs(t - 0.5) > 0.2),    # 8 down-up plateaus
        np.exp(-3 * t) * np.cos(6 * np.pi * t),                    # 9 damped oscillation
    ]
    out = np.stack(shapes)
    return out / np.abs(out).max(axis=1, keepdims=True)


def make_signals(num_examples: int, *, length: int = 40, noise: float = 0.15, smooth_noise: float = 0.15,
                 shear: float = 0.3, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Host-side generator: signals [N, length] float32 and labels [N] int32 (balanced classes)."""
    rng = np.random.default_rng(seed)
    base = templates()
    num_classes, m = base.shape
    labels = np.arange(num_examples) % num_classes
    rng.shuffle(labels)
    x = np.zeros((num_examples, length))
    grid = np.linspace(0.0, 1.0, m)
    t = np.arange(length, dtype=float)
    max_width = min(length, 2 * m)
    for i, k in enumerate(labels):
        width = int(rng.integers(max(4, m * 3 // 4), max_width + 1))
        offset = int(rng.integers(0, length - width + 1))
        x[i, offset:offset + width] = np.interp(np.linspace(0.0, 1.0, width), grid, base[k])
    x *= rng.uniform(0.7, 1.3, (num_examples, 1))
    x += rng.uniform(-shear, shear, (num_examples, 1)) * (t - t.mean()) / length
    walk = np.cumsum(rng.normal(size=(num_examples, length)), axis=1)
    walk -= walk.mean(axis=1, keepdims=True)
    padded = np.pad(walk, ((0, 0), (2, 2)), mode="edge")
    walk = sum(padded[:, j:j + length] for j in range(5)) / 5.0  # moving average of width 5
    walk /= walk.std(axis=1, keepdims=True) + 1e-6
    x += smooth_noise * walk + noise * rng.normal(size=x.shape)
    return x.astype(np.float32), labels.astype(np.int32)


def signals1d(batch_size: int = 128, *, num_examples: int = 5000, length: int = 40, noise: float = 0.15,
              smooth_noise: float = 0.15, shear: float = 0.3, seed: int = 0,
              fractions: Sequence[float] = (0.6, 0.1, 0.1, 0.2)) -> DataSource:
    """The procedural dataset as a DataSource (see module doc); same seed, same data."""
    x, y = make_signals(num_examples, length=length, noise=noise, smooth_noise=smooth_noise, shear=shear, seed=seed)
    data = from_arrays({"image": x[..., None], "label": y}, batch_size, fractions=fractions, seed=seed,
                       name="signals1d")
    return data.replace(num_classes=int(templates().shape[0]))

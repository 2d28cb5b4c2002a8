"""Loaders for the standard image-classification files: MNIST / Fashion-MNIST IDX, CIFAR-10
binary batches. Images are kept as uint8 [N, H, W, C] on the device (4x less memory than
float32); image tasks map them to [0, 1] with `as_float_images`.

The official training set is split (seeded, disjoint) into train / inner_valid / outer_valid
(80/10/10 by default); the official test set is the `test` split.
"""
from __future__ import annotations

import os
from typing import Optional, Sequence

import numpy as np

from tasks.datasets.data_source import DataSource, from_arrays
from tasks.datasets.idx import IDXFormatError, read_idx, read_maybe_gzip
from tasks.datasets.locate import find_files

MNIST_FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
               "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")
CIFAR10_TRAIN_FILES = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
CIFAR10_TEST_FILES = ("test_batch.bin",)
CIFAR10_RECORD = 1 + 32 * 32 * 3  # label byte + CHW uint8 pixels
TRAIN_FRACTIONS = (0.8, 0.1, 0.1, 0.0)  # of the official training set; test = official test set
# Each dataset's files and the subdirectories of a candidate dir they may sit in.
DATASET_FILES = {"mnist": (MNIST_FILES, ("",)), "fashion_mnist": (MNIST_FILES, ("",)),
                 "cifar10": (CIFAR10_TRAIN_FILES + CIFAR10_TEST_FILES, ("", "cifar-10-batches-bin"))}


class CIFARFormatError(ValueError):
    """A file that is not a CIFAR-10 binary batch."""


def downsample(images: np.ndarray, factor: int) -> np.ndarray:
    """Mean-pools [N, H, W, C] images by an integer `factor` (H, W divisible); keeps the dtype."""
    if factor == 1:
        return images
    n, h, w, c = images.shape
    if h % factor or w % factor:
        raise ValueError(f"image size {h}x{w} is not divisible by downsample factor {factor}")
    pooled = images.reshape(n, h // factor, factor, w // factor, factor, c).astype(np.float32).mean(axis=(2, 4))
    return np.round(pooled).astype(images.dtype) if np.issubdtype(images.dtype, np.integer) else pooled


def dataset_files(name: str, data_dir: Optional[str | os.PathLike] = None, *,
                  search: Optional[Sequence[str | os.PathLike]] = None) -> list:
    """The paths of dataset `name`'s files ("mnist", "fashion_mnist", "cifar10"), found as the
    loaders find them (`tasks.datasets.locate.find_files`; `search` replaces the candidate dirs),
    without reading them. Raises DatasetNotFoundError naming the files, the directories searched
    and how to get them."""
    if name not in DATASET_FILES:
        raise ValueError(f"dataset_files: unknown dataset {name!r}; known: {sorted(DATASET_FILES)}")
    files, subdirs = DATASET_FILES[name]
    return find_files(name, files, data_dir, subdirs=subdirs, search=search)


def read_idx_pair(images_path, labels_path, num_classes: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """Images [N, H, W, 1] uint8 and labels [N] int32 from an IDX image file and label file."""
    images = read_idx(images_path, expected_ndim=3)
    labels = read_idx(labels_path, expected_ndim=1)
    if images.shape[0] != labels.shape[0]:
        raise IDXFormatError(f"{images_path} has {images.shape[0]} images but {labels_path} has "
                             f"{labels.shape[0]} labels")
    if labels.size and int(labels.max()) >= num_classes:
        raise IDXFormatError(f"{labels_path}: label {int(labels.max())} >= num_classes={num_classes}")
    return images[..., None], labels.astype(np.int32)


def _image_source(train: tuple, test: tuple, batch_size: int, name: str, num_classes: int, seed: int,
                  factor: int, fractions: Sequence[float]) -> DataSource:
    (xtr, ytr), (xte, yte) = train, test
    xtr, xte = downsample(xtr, factor), downsample(xte, factor)
    data = from_arrays({"image": xtr, "label": ytr}, batch_size, fractions=fractions, seed=seed, name=name,
                       presplit={"test": {"image": xte, "label": yte}})
    return data.replace(num_classes=num_classes)


def mnist_like(name: str, batch_size: int = 128, *, data_dir: Optional[str | os.PathLike] = None, seed: int = 0,
               downsample_factor: int = 1, fractions: Sequence[float] = TRAIN_FRACTIONS) -> DataSource:
    """An MNIST-format dataset `name` ("mnist", "fashion_mnist"): {"image": [B, 28/f, 28/f, 1] uint8,
    "label": [B] int32}, 10 classes. Files are found by `tasks.datasets.locate.find_files`."""
    tri, trl, tei, tel = find_files(name, MNIST_FILES, data_dir)
    train, test = read_idx_pair(tri, trl), read_idx_pair(tei, tel)
    if train[0].shape[1:] != test[0].shape[1:]:
        raise IDXFormatError(f"{tei}: test images of shape {test[0].shape[1:3]}, but the training images in {tri} "
                             f"are {train[0].shape[1:3]}; the files are of different datasets (or sizes)")
    return _image_source(train, test, batch_size, name, 10, seed, downsample_factor, fractions)


def mnist(batch_size: int = 128, **kwargs) -> DataSource:
    """MNIST digits (see `mnist_like`)."""
    return mnist_like("mnist", batch_size, **kwargs)


def fashion_mnist(batch_size: int = 128, **kwargs) -> DataSource:
    """Fashion-MNIST (see `mnist_like`); the Debian package dataset-fashion-mnist provides it."""
    return mnist_like("fashion_mnist", batch_size, **kwargs)


def read_cifar10_batch(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """One CIFAR-10 binary batch: records of 1 label byte + 3072 CHW pixel bytes.
    Returns images [N, 32, 32, 3] uint8 (HWC) and labels [N] int32."""
    raw = np.frombuffer(read_maybe_gzip(path, CIFARFormatError), np.uint8)
    if raw.size == 0 or raw.size % CIFAR10_RECORD:
        raise CIFARFormatError(f"{path}: {raw.size} bytes is not a whole number of {CIFAR10_RECORD}-byte "
                               f"CIFAR-10 records (truncated or not a CIFAR-10 binary batch)")
    records = raw.reshape(-1, CIFAR10_RECORD)
    labels = records[:, 0].astype(np.int32)
    if int(labels.max()) >= 10:
        raise CIFARFormatError(f"{path}: label byte {int(labels.max())} >= 10; is it a CIFAR-100 file "
                               f"or not a CIFAR-10 binary batch?")
    images = records[:, 1:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return np.ascontiguousarray(images), labels


def cifar10(batch_size: int = 128, *, data_dir: Optional[str | os.PathLike] = None, seed: int = 0,
            downsample_factor: int = 1, fractions: Sequence[float] = TRAIN_FRACTIONS) -> DataSource:
    """CIFAR-10: {"image": [B, 32/f, 32/f, 3] uint8, "label": [B] int32}, 10 classes, read from
    data_batch_{1..5}.bin and test_batch.bin (the binary version, in `cifar-10-batches-bin/` or not)."""
    paths = dataset_files("cifar10", data_dir)
    train = [read_cifar10_batch(p) for p in paths[:5]]
    test = read_cifar10_batch(paths[5])
    train = (np.concatenate([t[0] for t in train]), np.concatenate([t[1] for t in train]))
    return _image_source(train, test, batch_size, "cifar10", 10, seed, downsample_factor, fractions)

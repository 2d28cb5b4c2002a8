"""Datasets by name, so tasks and gin configs can say dataset="digits".

Built-in names (loaded lazily: nothing touches the disk until `get_dataset`):
  digits                       scikit-learn's 8x8 digits (bundled, no files)
  signals1d                    procedural 1-D signals (no files)
  grammar_text, arithmetic_text procedural byte text (tasks.suites.texts; windows of 32 bytes, no files)
  mnist, fashion_mnist         IDX files, 28x28x1; `_14` / `_7` suffixes: mean-pooled 14x14 / 7x7
  cifar10                      binary batches, 32x32x3; `cifar10_16`, `cifar10_8`: pooled
Path names: "npz:/path/data.npz" (`load_npz`), "text:/path/file.txt" (`byte_sequences`, seq_len 64).
"""
from __future__ import annotations

import functools
from typing import Callable, Union

import jax

from tasks.base import check_count
from tasks.datasets.data_source import DataSource

_DATASETS: dict[str, Callable[..., DataSource]] = {}
_CACHE: dict[tuple, DataSource] = {}


def register_dataset(name: str, factory: Callable[..., DataSource]) -> None:
    """Registers `name`: `get_dataset(name, batch_size)` builds it with `factory(batch_size=batch_size)`,
    a DataSource (once per process; other batch sizes reuse its arrays)."""
    _DATASETS[name] = factory


def dataset_names() -> list[str]:
    """The registered dataset names (the built-ins and `register_dataset`'s), sorted."""
    _ensure_builtins()
    return sorted(_DATASETS)


def _path_factory(name: str):
    kind, _, path = name.partition(":")
    if kind == "npz":
        from tasks.datasets.npz import load_npz
        return functools.partial(load_npz, path)
    if kind == "text":
        from tasks.datasets.text import byte_sequences
        return functools.partial(byte_sequences, path)
    return None


def _factory(name: str) -> Callable[..., DataSource]:
    _ensure_builtins()
    factory = _DATASETS.get(name) or _path_factory(name)
    if factory is None:
        raise ValueError(f"unknown dataset {name!r}; registered datasets: {sorted(_DATASETS)} "
                         f"(or 'npz:PATH', 'text:PATH')")
    return factory


def check_dataset_name(name: str) -> str:
    """`name` if it names a dataset (registered, or 'npz:PATH' / 'text:PATH'); reads no file.

    Raises:
      ValueError: an unknown name (the message lists the registered ones).
    """
    _factory(name)
    return name


def get_dataset(name: str, batch_size: int) -> DataSource:
    """The named dataset with this batch size; loaded once per process and shared.

    Loading runs eagerly even when called while jax traces a function (the arrays are concrete,
    never tracers), so the first use of a dataset may be inside jit.

    Raises:
      ValueError: an unknown name.
      tasks.datasets.DatasetNotFoundError: the dataset's files are missing (the message names
        them, the directories searched and how to get them).
    """
    factory = _factory(name)
    key = (name, check_count(batch_size, f"get_dataset({name!r}): batch_size"))
    if key not in _CACHE:
        base = next((v for (n, _), v in _CACHE.items() if n == name), None)
        with jax.ensure_compile_time_eval():  # cached for the process: must not hold a trace's tracers
            _CACHE[key] = base.with_batch_size(batch_size) if base is not None else factory(batch_size=batch_size)
    return _CACHE[key]


def resolve_dataset(dataset: Union[str, DataSource], batch_size: int) -> DataSource:
    """`dataset` itself if it is a DataSource, else `get_dataset(dataset, batch_size)`."""
    return get_dataset(dataset, batch_size) if isinstance(dataset, str) else dataset


def _lazy(module: str, fn: str, **kwargs) -> Callable[..., DataSource]:
    def factory(batch_size: int) -> DataSource:
        import importlib
        return getattr(importlib.import_module(module), fn)(batch_size, **kwargs)
    return factory


def _ensure_builtins() -> None:
    if "digits" in _DATASETS:
        return
    register_dataset("digits", _lazy("tasks.datasets.digits", "digits"))
    register_dataset("signals1d", _lazy("tasks.datasets.signals", "signals1d"))
    for name in ("mnist", "fashion_mnist"):
        register_dataset(name, _lazy("tasks.datasets.image_files", name))
        register_dataset(f"{name}_14", _lazy("tasks.datasets.image_files", name, downsample_factor=2))
        register_dataset(f"{name}_7", _lazy("tasks.datasets.image_files", name, downsample_factor=4))
    register_dataset("cifar10", _lazy("tasks.datasets.image_files", "cifar10"))
    register_dataset("cifar10_16", _lazy("tasks.datasets.image_files", "cifar10", downsample_factor=2))
    register_dataset("cifar10_8", _lazy("tasks.datasets.image_files", "cifar10", downsample_factor=4))
    for name in ("grammar_text", "arithmetic_text"):  # procedural byte corpora (tasks.suites.texts)
        register_dataset(name, _lazy("tasks.suites.texts", "text_dataset", name=name))

"""Datasets by name, so tasks and gin configs can say dataset="digits"."""
from __future__ import annotations

from typing import Callable

from tasks.datasets.data_source import DataSource

_DATASETS: dict[str, Callable[..., DataSource]] = {}
_CACHE: dict[tuple, DataSource] = {}


def register_dataset(name: str, factory: Callable[..., DataSource]) -> None:
    """`factory(batch_size=...) -> DataSource`."""
    _DATASETS[name] = factory


def dataset_names() -> list[str]:
    _ensure_builtins()
    return sorted(_DATASETS)


def get_dataset(name: str, batch_size: int) -> DataSource:
    """The named dataset with this batch size; loaded once per process and shared."""
    _ensure_builtins()
    if name not in _DATASETS:
        raise ValueError(f"unknown dataset {name!r}; registered datasets: {sorted(_DATASETS)}")
    key = (name, int(batch_size))
    if key not in _CACHE:
        base = next((v for (n, _), v in _CACHE.items() if n == name), None)
        _CACHE[key] = base.with_batch_size(batch_size) if base is not None else _DATASETS[name](batch_size=batch_size)
    return _CACHE[key]


def _ensure_builtins() -> None:
    if "digits" not in _DATASETS:
        from tasks.datasets.digits import digits

        register_dataset("digits", digits)

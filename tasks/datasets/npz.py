"""Any `.npz` with arrays `x` [N, ...] and `y` [N] (and optionally `x_test`, `y_test`) as a DataSource."""
from __future__ import annotations

import os
import zipfile
from typing import Sequence

import numpy as np

from tasks.datasets.data_source import DataSource, from_arrays


def load_npz(path: str | os.PathLike, batch_size: int = 128, *, keys: tuple[str, str] = ("image", "label"),
             fractions: Sequence[float] = (0.6, 0.1, 0.1, 0.2), seed: int = 0, name: str | None = None) -> DataSource:
    """{keys[0]: x[i], keys[1]: y[i]} examples from `path`.

    With `x_test`/`y_test` in the file they form the `test` split and the other fractions are
    renormalised over `x`/`y` (`x_test` must have `x`'s per-example shape). Integer `y` are class
    indices (>= 0) and set `num_classes = max label + 1`. Errors name the file.
    """
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: np.asarray(f[k]) for k in f.files}
    except FileNotFoundError:
        raise FileNotFoundError(f"npz dataset file {path} does not exist") from None
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as e:
        raise ValueError(f"{path}: not a readable .npz file ({e})") from e
    missing = [k for k in ("x", "y") if k not in arrays]
    if missing:
        raise ValueError(f"{path}: needs arrays 'x' and 'y'; missing {missing}, found {sorted(arrays)}")
    xk, yk = keys
    presplit = None
    if "x_test" in arrays and "y_test" in arrays:
        presplit = {"test": {xk: arrays["x_test"], yk: arrays["y_test"]}}
    if arrays["x"].shape[0] != arrays["y"].shape[0]:
        raise ValueError(f"{path}: x has {arrays['x'].shape[0]} examples but y has {arrays['y'].shape[0]}")
    if name is None:
        name = os.path.splitext(os.path.basename(str(path)))[0]
    try:
        return from_arrays({xk: arrays["x"], yk: arrays["y"]}, batch_size, fractions=fractions, seed=seed,
                           name=name, presplit=presplit, label_key=yk)
    except ValueError as e:
        raise ValueError(f"{path} (x, y; test split x_test, y_test): {e}") from None

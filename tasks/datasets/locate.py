"""Where dataset files live: argument, then $LOPT_DATA_DIR, then ~/.cache/lopt, then Debian.

For dataset `name` and candidate directory D, both `D/name/` and `D/` are searched. A file
`f.gz` may stand in for `f` and vice versa. Nothing here downloads.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Sequence

# Directories that distribution packages install datasets into, per dataset name.
SYSTEM_DIRS: dict[str, tuple[str, ...]] = {
    "fashion_mnist": ("/usr/share/datasets/fashion-mnist",),
    "mnist": ("/usr/share/datasets/mnist",),
    "cifar10": ("/usr/share/datasets/cifar10",),
}

# The distribution packages that install a dataset into its SYSTEM_DIRS.
SYSTEM_PACKAGES: dict[str, str] = {"fashion_mnist": "dataset-fashion-mnist"}

HOW_TO_GET: dict[str, str] = {
    "fashion_mnist": f"install the Debian package (apt-get install {SYSTEM_PACKAGES['fashion_mnist']}), or run "
                     "`python -m tasks.datasets.download fashion_mnist`",
    "mnist": "run `python -m tasks.datasets.download mnist`, or copy the four IDX files there",
    "cifar10": "run `python -m tasks.datasets.download cifar10`, or extract cifar-10-binary.tar.gz there",
}


class DatasetNotFoundError(FileNotFoundError):
    """Raised when a dataset's files are in none of the searched directories."""


def cache_dir() -> Path:
    """`$LOPT_DATA_DIR` if set, else `~/.cache/lopt`: where downloads go."""
    env = os.environ.get("LOPT_DATA_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "lopt"


def candidate_dirs(name: str, data_dir: Optional[str | os.PathLike] = None) -> list[Path]:
    """Directories searched for dataset `name`, in order."""
    roots: list[Path] = []
    if data_dir is not None:
        roots.append(Path(data_dir).expanduser())
    env = os.environ.get("LOPT_DATA_DIR")
    if env:
        roots.append(Path(env).expanduser())
    roots.append(Path.home() / ".cache" / "lopt")
    out: list[Path] = []
    for r in roots:
        out += [r / name, r]
    out += [Path(d) for d in SYSTEM_DIRS.get(name, ())]
    seen, uniq = set(), []
    for d in out:
        if d not in seen:
            seen.add(d)
            uniq.append(d)
    return uniq


def _variants(filename: str) -> tuple[str, str]:
    return (filename, filename[:-3]) if filename.endswith(".gz") else (filename, filename + ".gz")


def find_files(name: str, filenames: Sequence[str], data_dir: Optional[str | os.PathLike] = None, *,
               subdirs: Sequence[str] = ("",), search: Optional[Sequence[str | os.PathLike]] = None) -> list[Path]:
    """Paths of `filenames` (gz or not) from the first candidate dir that holds all of them.

    `subdirs` are also tried inside each candidate (e.g. CIFAR-10's "cifar-10-batches-bin");
    `search`, if given, replaces `candidate_dirs(name, data_dir)` (e.g. only `SYSTEM_DIRS[name]`).
    Only file names are checked: nothing is read.
    Raises DatasetNotFoundError listing the files, the directories searched and how to get them.
    """
    roots = candidate_dirs(name, data_dir) if search is None else [Path(d) for d in search]
    dirs = [d / s if s else d for d in roots for s in subdirs]
    for d in dirs:
        found = []
        for f in filenames:
            hit = next((d / v for v in _variants(f) if (d / v).is_file()), None)
            if hit is None:
                break
            found.append(hit)
        else:
            return found
    raise DatasetNotFoundError(
        f"dataset {name!r}: looked for {list(filenames)} (with or without .gz) in "
        f"{[str(d) for d in dirs]} and found them in none. To get them: "
        f"{HOW_TO_GET.get(name, 'put the files in one of those directories')}; or pass data_dir=... "
        f"or set LOPT_DATA_DIR.")

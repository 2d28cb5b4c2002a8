"""Shared test helpers: compile counting and small fixtures."""
import contextlib
import os
import sys

import jax
import jax.monitoring
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if os.path.join(ROOT, "scripts") not in sys.path:
    sys.path.insert(0, os.path.join(ROOT, "scripts"))

_COMPILES = [0]


def _listener(event, duration, **kwargs):
    if event == "/jax/core/compile/backend_compile_duration":
        _COMPILES[0] += 1


jax.monitoring.register_event_duration_secs_listener(_listener)


class CompileCounter:
    """`with compile_counter() as c: ...; c.count` = XLA backend compilations inside the block."""

    def __init__(self):
        self.count = 0

    @contextlib.contextmanager
    def __call__(self):
        start = _COMPILES[0]
        try:
            yield self
        finally:
            self.count = _COMPILES[0] - start


@pytest.fixture
def compile_counter():
    return CompileCounter()


def requires_dataset(name, *, system_copy=False):
    """A skipif mark for tests that need dataset `name`'s files ("fashion_mnist", "mnist", "cifar10").

    The test runs where lopt's loaders find the files (tasks.datasets.dataset_files; with
    `system_copy`, only in the directories a distribution package installs them into,
    tasks.datasets.locate.SYSTEM_DIRS). Elsewhere it is skipped, never silently: the reason names
    the files, the directories searched and how to get them (e.g. apt-get install dataset-fashion-mnist),
    and `pytest -rs` prints it. Only file names are checked at collection; nothing is read.
    """
    from tasks.datasets import DatasetNotFoundError, dataset_files, locate
    from tasks.datasets.image_files import DATASET_FILES

    dirs = locate.SYSTEM_DIRS.get(name, ()) if system_copy else None
    try:
        dataset_files(name, search=dirs)
    except DatasetNotFoundError as e:
        if not system_copy:
            return pytest.mark.skip(reason=f"needs dataset {name!r}, absent here: {e}")
        package = locate.SYSTEM_PACKAGES.get(name)
        how = f"apt-get install {package}" if package else "no distribution package provides it"
        return pytest.mark.skip(reason=f"needs the system copy of dataset {name!r}: {list(DATASET_FILES[name][0])} "
                                       f"in {list(dirs)}, absent here; to get it: {how}")
    return pytest.mark.skipif(False, reason=f"dataset {name!r} is present")

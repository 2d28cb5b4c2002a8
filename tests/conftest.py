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

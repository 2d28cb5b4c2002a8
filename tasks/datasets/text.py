"""Raw text (or any bytes) as fixed-length byte sequences for byte-level language modelling.

The byte stream is cut into four contiguous, disjoint regions (train / inner_valid /
outer_valid / test, by `fractions`), and each region into windows of `seq_len` bytes every
`stride` bytes. A batch is {"tokens": [B, seq_len] uint8}; vocabulary size 256.
"""
from __future__ import annotations

import os
from typing import Sequence, Union

import jax.numpy as jnp
import numpy as np

from tasks.base import check_count
from tasks.datasets.data_source import SPLITS, DataSource, split_fractions_to_counts

VOCAB_SIZE = 256


def _windows(stream: np.ndarray, seq_len: int, stride: int) -> np.ndarray:
    n = (stream.size - seq_len) // stride + 1 if stream.size >= seq_len else 0
    idx = np.arange(n)[:, None] * stride + np.arange(seq_len)[None, :]
    return stream[idx]


def byte_sequences(source: Union[str, os.PathLike, bytes], batch_size: int = 32, *, seq_len: int = 64,
                   stride: int | None = None, fractions: Sequence[float] = (0.8, 0.05, 0.05, 0.1),
                   name: str | None = None) -> DataSource:
    """A DataSource of byte windows from a file path or a bytes object (see module doc).

    Args:
      source: a file path, or the bytes themselves.
      batch_size: windows per batch (>= 1).
      seq_len: bytes per window (>= 2: inputs and next-byte targets).
      stride: bytes between window starts (>= 1; None: seq_len, windows that do not overlap).
      fractions: the four splits' shares of the byte stream.
      name: the DataSource's name (default: "text_" + the file's stem, or "bytes").

    Returns:
      The DataSource of {"tokens": [B, seq_len] uint8}.
    """
    check_count(batch_size, "byte_sequences: batch_size")
    if stride is not None:
        check_count(stride, "byte_sequences: stride")
    if isinstance(source, (bytes, bytearray)):
        raw, name = bytes(source), name or "bytes"
    else:
        try:
            with open(source, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            raise FileNotFoundError(f"text dataset file {source} does not exist") from None
        name = name or f"text_{os.path.splitext(os.path.basename(str(source)))[0]}"
    if seq_len < 2:
        raise ValueError(f"seq_len must be >= 2 (inputs and next-byte targets), got {seq_len}")
    stride = int(seq_len if stride is None else stride)
    stream = np.frombuffer(raw, np.uint8)
    try:
        counts = split_fractions_to_counts(stream.size, fractions)
    except ValueError as e:
        raise ValueError(f"{name}: {stream.size} bytes are too few for four splits of windows with "
                         f"seq_len={seq_len} (fewer than seq_len bytes per split): {e}") from None
    splits, start = {}, 0
    for split, c in zip(SPLITS, counts):
        win = _windows(stream[start:start + c], seq_len, stride)
        start += c
        if win.shape[0] == 0:
            raise ValueError(f"{name}: {stream.size} bytes give the {split!r} split {c} bytes, fewer than "
                             f"seq_len={seq_len}; use a longer text, a shorter seq_len or other fractions")
        splits[split] = {"tokens": jnp.asarray(win)}
    return DataSource(splits=splits, batch_size=int(batch_size), name=name, num_classes=VOCAB_SIZE)

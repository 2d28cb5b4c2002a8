"""The blocks a torch rule walks a tensor in (`lopt.parts.layout`), and the scratch memory they reuse.

- `chunks`, `chunk_rows`  the blocks a rule walks a big tensor in, so that its [F, c] features and
                          [H, c] activations stay small (no [n, F] array exists)
- `Workspace`             scratch tensors reused across blocks and steps, so that walking a tensor
                          allocates nothing per block

How a tensor is cut changes the speed, never the function computed. (The torch axes layout, which
parameter axes are JAX's rows and columns, is `lopt.torch.layout`.) Tensors are created on the
inputs' device and dtype.
"""
from __future__ import annotations

import math
from typing import Iterator, Sequence

import torch

__all__ = ["chunks", "chunk_rows", "Workspace"]


def chunks(n: int, size: int) -> Iterator[tuple[int, int]]:
    """(start, end) of consecutive blocks of at most `size` elements covering [0, n)."""
    size = max(int(size), 1)
    for start in range(0, n, size):
        yield start, min(start + size, n)


def chunk_rows(shape: Sequence[int], size: int) -> Iterator[tuple[int, int]]:
    """(start, end) blocks of the first axis of a tensor of `shape` (ndim ≥ 1), each about `size`
    elements (at least one row)."""
    rows = shape[0]
    per_row = max(math.prod(shape[1:]), 1)
    return chunks(rows, max(size // per_row, 1))


class Workspace:
    """Scratch tensors reused across blocks, tensors and steps, one per name, device and dtype.

    `get` returns a view of a cached flat buffer (grown when a bigger one is asked for), so that a
    rule walking a big tensor block by block writes its features and activations into the same
    memory every time instead of allocating (and, for big tensors, page-faulting in) fresh tensors.
    A buffer is valid until the next `get` of the same name.
    """

    def __init__(self):
        self._buffers: dict = {}

    def get(self, name: str, shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A [*shape] tensor of `dtype` on `device` (uninitialised) backed by the buffer `name`."""
        n = math.prod(shape)
        key = (name, str(device), dtype)
        buf = self._buffers.get(key)
        if buf is None or buf.numel() < n:
            buf = self._buffers[key] = torch.empty((n,), dtype=dtype, device=device)
        return buf[:n].view(tuple(shape))

"""The IDX format of MNIST / Fashion-MNIST: a big-endian header, then the raw array.

Header: 2 zero bytes, a dtype code, the number of dims n, then n uint32 dims. Payload: the
prod(dims) values, big-endian. Files may be gzip-compressed (detected by the gzip magic).
"""
from __future__ import annotations

import gzip
import os
import struct

import numpy as np

# IDX dtype code -> numpy dtype (big-endian where it matters).
IDX_DTYPES = {0x08: np.dtype(np.uint8), 0x09: np.dtype(np.int8), 0x0B: np.dtype(">i2"),
              0x0C: np.dtype(">i4"), 0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}
_CODES = {v.newbyteorder("<") if v.itemsize > 1 else v: k for k, v in IDX_DTYPES.items()}


class IDXFormatError(ValueError):
    """A file that is not a well-formed IDX file."""


def read_maybe_gzip(path: str | os.PathLike, error: type = IDXFormatError) -> bytes:
    """The bytes of `path`, gunzipped if it starts with the gzip magic; `error` on a bad stream."""
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (EOFError, OSError) as e:
            raise error(f"{path}: corrupt or truncated gzip stream ({e}); delete and re-fetch it") from e
    return raw


def read_idx(path: str | os.PathLike, expected_ndim: int | None = None) -> np.ndarray:
    """Reads an IDX file (gz or not) into a native-endian array of shape dims."""
    raw = read_maybe_gzip(path)
    if len(raw) < 4:
        raise IDXFormatError(f"{path}: {len(raw)} bytes is too short for an IDX header")
    zero, code, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0 or code not in IDX_DTYPES or ndim == 0:
        raise IDXFormatError(f"{path}: bad IDX magic number 0x{raw[:4].hex()} (expected 0x0000 then a "
                             f"dtype code in {sorted(hex(c) for c in IDX_DTYPES)} and ndim >= 1); "
                             f"is it an IDX file?")
    if expected_ndim is not None and ndim != expected_ndim:
        raise IDXFormatError(f"{path}: IDX file has {ndim} dims, expected {expected_ndim}")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise IDXFormatError(f"{path}: truncated IDX header ({len(raw)} bytes, need {header})")
    dims = struct.unpack(f">{ndim}I", raw[4:header])
    dtype = IDX_DTYPES[code]
    need = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    have = len(raw) - header
    if have != need:
        what = "truncated" if have < need else "has trailing bytes"
        raise IDXFormatError(f"{path}: {what}: dims {dims} need {need} payload bytes, found {have}")
    arr = np.frombuffer(raw, dtype=dtype, count=int(np.prod(dims)), offset=header).reshape(dims)
    return arr.astype(dtype.newbyteorder("=")) if dtype.itemsize > 1 else arr.copy()


def write_idx(path: str | os.PathLike, array: np.ndarray, *, compress: bool | None = None) -> None:
    """Writes `array` as IDX; gzip-compressed when `compress` (default: path ends in .gz)."""
    a = np.asarray(array)
    key = a.dtype.newbyteorder("<") if a.dtype.itemsize > 1 else a.dtype
    if key not in _CODES:
        raise ValueError(f"dtype {a.dtype} has no IDX code; use one of {list(IDX_DTYPES.values())}")
    code = _CODES[key]
    raw = struct.pack(">HBB", 0, code, a.ndim) + struct.pack(f">{a.ndim}I", *a.shape)
    raw += a.astype(IDX_DTYPES[code]).tobytes()
    if compress if compress is not None else str(path).endswith(".gz"):
        raw = gzip.compress(raw)
    with open(path, "wb") as f:
        f.write(raw)

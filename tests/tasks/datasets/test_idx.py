import gzip

import numpy as np
import pytest

from tasks.datasets import IDXFormatError, read_idx, write_idx


@pytest.mark.parametrize("name", ["a-idx3-ubyte", "a-idx3-ubyte.gz"])
@pytest.mark.parametrize("dtype", [np.uint8, np.int32, np.float32])
def test_round_trip(tmp_path, name, dtype):
    a = (np.arange(2 * 3 * 4) % 251).reshape(2, 3, 4).astype(dtype)
    write_idx(tmp_path / name, a)
    b = read_idx(tmp_path / name, expected_ndim=3)
    assert b.dtype == a.dtype and b.shape == a.shape
    np.testing.assert_array_equal(a, b)
    assert (open(tmp_path / name, "rb").read(2) == b"\x1f\x8b") == name.endswith(".gz")


def test_wrong_magic(tmp_path):
    (tmp_path / "bad").write_bytes(b"\x12\x34\x08\x01" + b"\x00" * 20)
    with pytest.raises(IDXFormatError, match="magic"):
        read_idx(tmp_path / "bad")


def test_truncated_payload_and_header(tmp_path):
    write_idx(tmp_path / "x", np.zeros((5, 4, 4), np.uint8))
    raw = (tmp_path / "x").read_bytes()
    (tmp_path / "short").write_bytes(raw[:-3])
    with pytest.raises(IDXFormatError, match="truncated"):
        read_idx(tmp_path / "short")
    (tmp_path / "hdr").write_bytes(raw[:6])
    with pytest.raises(IDXFormatError, match="truncated IDX header"):
        read_idx(tmp_path / "hdr")
    (tmp_path / "long").write_bytes(raw + b"\x00")
    with pytest.raises(IDXFormatError, match="trailing"):
        read_idx(tmp_path / "long")


def test_truncated_gzip(tmp_path):
    raw = gzip.compress(b"\x00\x00\x08\x01" + b"\x00\x00\x00\x10" + bytes(range(16)))
    (tmp_path / "t.gz").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(IDXFormatError, match="gzip"):
        read_idx(tmp_path / "t.gz")


def test_wrong_ndim(tmp_path):
    write_idx(tmp_path / "labels", np.zeros(7, np.uint8))
    with pytest.raises(IDXFormatError, match="1 dims, expected 3"):
        read_idx(tmp_path / "labels", expected_ndim=3)

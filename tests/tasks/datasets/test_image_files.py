import jax
import numpy as np
import pytest

import tasks
from tasks.datasets import (CIFARFormatError, DatasetNotFoundError, IDXFormatError, cifar10, fashion_mnist, mnist,
                            read_cifar10_batch, write_idx)
from tests.conftest import requires_dataset
from tests.tasks.datasets.conftest import cifar_records, write_fake_cifar, write_fake_mnist


def _rows(a):
    return {r.tobytes() for r in np.asarray(a).reshape(a.shape[0], -1)}


@pytest.mark.parametrize("gz", [True, False])
def test_mnist_round_trip_and_splits(isolated, gz):
    tri, trl, tei, tel = write_fake_mnist(isolated / "d" / "mnist", gz=gz)
    data = mnist(8, data_dir=isolated / "d")
    assert data.num_classes == 10 and data.name == "mnist"
    assert {s: data.num_examples(s) for s in data.splits} == {"train": 48, "inner_valid": 6, "outer_valid": 6,
                                                              "test": 20}
    np.testing.assert_array_equal(np.asarray(data.splits["test"]["image"])[..., 0], tei)
    train_rows = set().union(*(_rows(data.splits[s]["image"]) for s in ("train", "inner_valid", "outer_valid")))
    assert train_rows == _rows(tri)  # the official training set, split without loss or overlap
    sizes = [len(_rows(data.splits[s]["image"])) for s in ("train", "inner_valid", "outer_valid")]
    assert sum(sizes) == 60
    b1, b2 = data.batch(jax.random.key(0)), data.batch(jax.random.key(0))
    assert b1["image"].shape == (8, 28, 28, 1) and b1["image"].dtype == np.uint8
    np.testing.assert_array_equal(b1["image"], b2["image"])
    small = mnist(8, data_dir=isolated / "d", downsample_factor=4)
    assert small.element_spec()["image"].shape == (8, 7, 7, 1)


def test_env_and_cache_dirs(isolated, monkeypatch):
    write_fake_mnist(isolated / "env" / "fashion_mnist")
    monkeypatch.setenv("LOPT_DATA_DIR", str(isolated / "env"))
    assert fashion_mnist(4).num_examples("test") == 20
    monkeypatch.delenv("LOPT_DATA_DIR")
    write_fake_mnist(isolated / "home" / ".cache" / "lopt" / "fashion_mnist", n_test=10)
    assert fashion_mnist(4).num_examples("test") == 10


def test_missing_files_error_says_where_and_how(isolated):
    with pytest.raises(DatasetNotFoundError) as e:
        mnist(4, data_dir=isolated / "nowhere")
    msg = str(e.value)
    assert "train-images-idx3-ubyte.gz" in msg and str(isolated / "nowhere") in msg
    assert ".cache/lopt" in msg and "tasks.datasets.download mnist" in msg


def test_corrupt_mnist_files(isolated):
    d = isolated / "mnist"
    write_fake_mnist(d)
    write_idx(d / "t10k-labels-idx1-ubyte.gz", np.zeros(19, np.uint8))
    with pytest.raises(IDXFormatError, match="20 images but .* 19 labels"):
        mnist(4, data_dir=isolated)


def test_mnist_test_images_of_another_size_are_refused_naming_both_files(isolated):
    """A 14x14 t10k file beside 28x28 training images used to load (and fail later, in a task)."""
    d = isolated / "mnist"
    write_fake_mnist(d)
    write_idx(d / "t10k-images-idx3-ubyte.gz", np.zeros((20, 14, 14), np.uint8))
    with pytest.raises(IDXFormatError, match=r"t10k-images-idx3-ubyte.gz: test images of shape \(14, 14\), but the "
                                             r"training images in .*train-images-idx3-ubyte.gz are \(28, 28\)"):
        mnist(4, data_dir=isolated)
    write_idx(d / "t10k-labels-idx1-ubyte.gz", np.full(20, 12, np.uint8))
    with pytest.raises(IDXFormatError, match="label 12"):
        mnist(4, data_dir=isolated)
    (d / "t10k-labels-idx1-ubyte.gz").write_bytes(b"\x00\x00\x0f\x01abcd")
    with pytest.raises(IDXFormatError, match="magic"):
        mnist(4, data_dir=isolated)


def test_cifar10_round_trip(isolated):
    written = write_fake_cifar(isolated / "cifar10" / "cifar-10-batches-bin")
    data = cifar10(4, data_dir=isolated)
    assert data.element_spec()["image"].shape == (4, 32, 32, 3) and data.num_classes == 10
    images, labels = written["test_batch.bin"]
    np.testing.assert_array_equal(data.splits["test"]["image"], images)
    np.testing.assert_array_equal(data.splits["test"]["label"], labels)
    assert sum(data.num_examples(s) for s in ("train", "inner_valid", "outer_valid")) == 50
    assert cifar10(4, data_dir=isolated, downsample_factor=4).element_spec()["image"].shape == (4, 8, 8, 3)


def test_cifar10_channel_layout(tmp_path):
    raw, images, labels = cifar_records(3, 0)
    (tmp_path / "b.bin").write_bytes(raw)
    x, y = read_cifar10_batch(tmp_path / "b.bin")
    rec = np.frombuffer(raw, np.uint8).reshape(3, -1)
    # pixel (row 2, col 5) of record 1: red at 1 + 2*32+5, green 1024 later, blue 2048 later
    assert tuple(x[1, 2, 5]) == tuple(rec[1, [1 + 69, 1 + 1024 + 69, 1 + 2048 + 69]])
    np.testing.assert_array_equal(y, labels)


def test_cifar10_corrupt(tmp_path):
    raw, _, _ = cifar_records(2, 0)
    (tmp_path / "t.bin").write_bytes(raw[:-10])
    with pytest.raises(CIFARFormatError, match="whole number"):
        read_cifar10_batch(tmp_path / "t.bin")
    bad = bytearray(raw)
    bad[0] = 42
    (tmp_path / "l.bin").write_bytes(bytes(bad))
    with pytest.raises(CIFARFormatError, match="label byte 42"):
        read_cifar10_batch(tmp_path / "l.bin")


@requires_dataset("fashion_mnist", system_copy=True)
def test_real_fashion_mnist_from_debian(monkeypatch, tmp_path):
    monkeypatch.delenv("LOPT_DATA_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    data = fashion_mnist(32)
    assert {s: data.num_examples(s) for s in data.splits} == {"train": 48000, "inner_valid": 6000,
                                                              "outer_valid": 6000, "test": 10000}
    counts = np.bincount(np.asarray(data.splits["test"]["label"]), minlength=10)
    np.testing.assert_array_equal(counts, np.full(10, 1000))  # the official test set is balanced
    assert tasks.get_dataset("fashion_mnist", 32).num_classes == 10

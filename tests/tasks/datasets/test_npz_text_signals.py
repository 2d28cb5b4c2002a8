import subprocess
import sys

import jax
import numpy as np
import pytest

import tasks
from tasks.datasets import SPLITS, byte_sequences, load_npz, make_signals, signals1d


def test_npz_round_trip(tmp_path):
    x = np.arange(100 * 3, dtype=np.float32).reshape(100, 3)
    y = (np.arange(100) % 4).astype(np.int64)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    data = load_npz(tmp_path / "d.npz", 5)
    assert data.num_classes == 4 and data.name == "d"
    got = np.concatenate([np.asarray(data.splits[s]["image"]) for s in SPLITS])
    np.testing.assert_array_equal(np.sort(got[:, 0]), x[:, 0])  # every example once
    np.savez(tmp_path / "t.npz", x=x, y=y, x_test=x[:7], y_test=y[:7])
    data = load_npz(tmp_path / "t.npz", 5, keys=("x", "y"))
    assert data.num_examples("test") == 7 and set(data.splits["train"]) == {"x", "y"} and data.num_classes == 4
    assert tasks.get_dataset(f"npz:{tmp_path / 'd.npz'}", 3).batch(jax.random.key(0))["image"].shape == (3, 3)


def test_npz_errors(tmp_path):
    np.savez(tmp_path / "nox.npz", y=np.zeros(3))
    with pytest.raises(ValueError, match="missing \\['x'\\]"):
        load_npz(tmp_path / "nox.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="not a readable .npz"):
        load_npz(tmp_path / "junk.npz")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_npz(tmp_path / "absent.npz")


def test_npz_negative_labels_and_test_features_of_another_shape_name_the_file(tmp_path):
    """Labels of -1 used to give num_classes=0; an x_test of another shape was accepted."""
    x, y = np.zeros((20, 3), np.float32), np.arange(20) % 2
    np.savez(tmp_path / "neg.npz", x=x, y=np.full(20, -1))
    with pytest.raises(ValueError, match=r"neg.npz .*class indices and must be >= 0, but the 'label' array holds -1"):
        load_npz(tmp_path / "neg.npz")
    np.savez(tmp_path / "negtest.npz", x=x, y=y, x_test=x[:4], y_test=np.asarray([0, 1, -2, 0]))
    with pytest.raises(ValueError, match=r"negtest.npz .*the 'test' split's 'label' array holds -2"):
        load_npz(tmp_path / "negtest.npz")
    np.savez(tmp_path / "shape.npz", x=x, y=y, x_test=np.zeros((4, 5), np.float32), y_test=y[:4])
    with pytest.raises(ValueError, match=r"shape.npz .*the 'test' split's 'image' examples have shape \(5,\) but "
                                         r"the other splits' have \(3,\)"):
        load_npz(tmp_path / "shape.npz")


@pytest.mark.parametrize("make, what", [
    (lambda p: load_npz(p, 0), "DataSource 'd': batch_size must be an integer >= 1, got 0"),
    (lambda p: byte_sequences(bytes(1000), 0), "byte_sequences: batch_size must be an integer >= 1, got 0"),
    (lambda p: byte_sequences(bytes(1000), 2, stride=-1), "byte_sequences: stride must be an integer >= 1, got -1"),
    (lambda p: byte_sequences(bytes(1000), 2, stride=0), "byte_sequences: stride must be an integer >= 1, got 0"),
    (lambda p: tasks.get_dataset("digits", 0), r"get_dataset\('digits'\): batch_size must be an integer >= 1"),
    (lambda p: signals1d(8, num_examples=300).with_batch_size(0), "DataSource 'signals1d': batch_size must be"),
    (lambda p: tasks.ImageMLPFamily(batch_size=0), "ImageMLPFamily: batch_size must be an integer >= 1, got 0"),
    (lambda p: tasks.ConvFamily(signals1d(8, num_examples=300), batch_size=-1), "ConvFamily: batch_size must be"),
    (lambda p: tasks.ImageMLPTask(batch_size=0), "ImageMLPTask: batch_size must be"),
    (lambda p: tasks.ByteLMFamily(byte_sequences(bytes(1000), 2, seq_len=8), batch_size=0),
     "ByteLMFamily: batch_size must be"),
    (lambda p: tasks.LinearRegressionFamily(4, batch_size=0), "LinearRegressionFamily: batch_size must be"),
])
def test_bad_batch_size_and_stride_are_refused_naming_the_argument(tmp_path, make, what):
    """batch_size=0 used to be accepted; stride=-1 was reported as "fewer than seq_len"."""
    np.savez(tmp_path / "d.npz", x=np.zeros((20, 3), np.float32), y=np.arange(20) % 2)
    with pytest.raises(ValueError, match=what):
        make(tmp_path / "d.npz")


def test_byte_sequences_contiguous_disjoint_regions(tmp_path):
    text = bytes(range(256)) * 4  # 1024 bytes, every window identifiable by its first byte and offset
    (tmp_path / "t.txt").write_bytes(text)
    data = byte_sequences(tmp_path / "t.txt", 2, seq_len=8, fractions=(0.5, 0.125, 0.125, 0.25))
    assert data.num_classes == 256 and data.name == "text_t"
    spans = {s: data.splits[s]["tokens"] for s in SPLITS}
    assert {s: v.shape[0] for s, v in spans.items()} == {"train": 64, "inner_valid": 16, "outer_valid": 16,
                                                         "test": 32}
    stream = np.frombuffer(text, np.uint8)
    np.testing.assert_array_equal(spans["test"][0], stream[768:776])
    np.testing.assert_array_equal(spans["inner_valid"][-1], stream[632:640])
    overlap = byte_sequences(text, 2, seq_len=8, stride=4, fractions=(0.5, 0.125, 0.125, 0.25))
    assert overlap.num_examples("train") == 127
    (tmp_path / "long.txt").write_bytes(text * 8)
    b = tasks.get_dataset(f"text:{tmp_path / 'long.txt'}", 3).batch(jax.random.key(1), "test")
    assert b["tokens"].shape == (3, 64) and b["tokens"].dtype == np.uint8


def test_byte_sequences_too_short():
    with pytest.raises(ValueError, match="fewer than seq_len"):
        byte_sequences(b"tiny text", 2, seq_len=8)
    with pytest.raises(FileNotFoundError):
        byte_sequences("/nonexistent/file.txt")


def test_signals_deterministic_balanced_and_learnable_shape():
    x1, y1 = make_signals(200, seed=3)
    x2, y2 = make_signals(200, seed=3)
    np.testing.assert_array_equal(x1, x2)
    np.testing.assert_array_equal(y1, y2)
    assert not np.array_equal(make_signals(200, seed=4)[0], x1)
    assert x1.shape == (200, 40) and np.all(np.bincount(y1) == 20)
    assert 0.2 < x1.std() < 2.0
    data = signals1d(8, num_examples=300)
    assert data.num_classes == 10 and data.element_spec()["image"].shape == (8, 40, 1)


def test_splits_disjoint_and_batches_deterministic():
    data = signals1d(16, num_examples=300)
    rows = [{r.tobytes() for r in np.asarray(data.splits[s]["image"])} for s in SPLITS]
    assert sum(len(r) for r in rows) == 300 and len(set().union(*rows)) == 300
    b1 = data.batch(jax.random.key(5), "outer_valid")
    b2 = data.batch(jax.random.key(5), "outer_valid")
    b3 = data.batch(jax.random.key(6), "outer_valid")
    np.testing.assert_array_equal(b1["image"], b2["image"])
    assert not np.array_equal(b1["image"], b3["image"])
    assert {r.tobytes() for r in np.asarray(b1["image"])} <= rows[2]


def test_registry_names_and_lazy_import(tmp_path):
    names = tasks.dataset_names()
    for n in ("digits", "signals1d", "mnist", "fashion_mnist", "cifar10", "mnist_14", "cifar10_8"):
        assert n in names
    with pytest.raises(ValueError, match="unknown dataset"):
        tasks.get_dataset("imagenet", 4)
    code = ("import sys, tasks, tasks.registry as r; "
            "assert not r._CACHE; assert 'sklearn' not in sys.modules; print('ok')")
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr
    assert not (tmp_path / ".cache").exists()  # importing tasks created nothing in the cache dir

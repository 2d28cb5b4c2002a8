import numpy as np
import pytest

from tasks.datasets import locate, write_idx
from tasks.datasets.image_files import CIFAR10_TEST_FILES, CIFAR10_TRAIN_FILES


@pytest.fixture
def isolated(monkeypatch, tmp_path):
    """No LOPT_DATA_DIR, an empty HOME and no system dirs: only what the test writes is found."""
    monkeypatch.delenv("LOPT_DATA_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(locate, "SYSTEM_DIRS", {})
    return tmp_path


def write_fake_mnist(directory, n_train=60, n_test=20, gz=True, seed=0):
    """Writes the four MNIST IDX files; returns (train_images, train_labels, test_images, test_labels)."""
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    arrays = (rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8), (np.arange(n_train) % 10).astype(np.uint8),
              rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8), (np.arange(n_test) % 10).astype(np.uint8))
    names = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
    for name, a in zip(names, arrays):
        write_idx(directory / (name + (".gz" if gz else "")), a)
    return arrays


def cifar_records(n, seed):
    """n CIFAR-10 records: bytes, plus the HWC images and labels they encode."""
    rng = np.random.default_rng(seed)
    chw = rng.integers(0, 256, (n, 3, 32, 32), dtype=np.uint8)
    labels = (np.arange(n) % 10).astype(np.uint8)
    raw = np.concatenate([labels[:, None], chw.reshape(n, -1)], axis=1).tobytes()
    return raw, chw.transpose(0, 2, 3, 1), labels


def write_fake_cifar(directory, n=10):
    directory.mkdir(parents=True, exist_ok=True)
    out = {}
    for i, name in enumerate(CIFAR10_TRAIN_FILES + CIFAR10_TEST_FILES):
        raw, images, labels = cifar_records(n, i)
        (directory / name).write_bytes(raw)
        out[name] = (images, labels)
    return out

"""Device-resident data sources and loaders for local dataset files (nothing downloads)."""
from tasks.datasets.data_source import SPLITS, DataSource, as_float_images, from_arrays
from tasks.datasets.digits import digits
from tasks.datasets.idx import IDXFormatError, read_idx, write_idx
from tasks.datasets.image_files import (CIFARFormatError, cifar10, dataset_files, fashion_mnist, mnist,
                                       read_cifar10_batch)
from tasks.datasets.locate import DatasetNotFoundError, cache_dir, candidate_dirs, find_files
from tasks.datasets.npz import load_npz
from tasks.datasets.signals import make_signals, signals1d
from tasks.datasets.text import VOCAB_SIZE, byte_sequences

__all__ = [
    "SPLITS", "DataSource", "from_arrays", "as_float_images", "digits", "signals1d", "make_signals",
    "mnist", "fashion_mnist", "cifar10", "dataset_files", "read_cifar10_batch", "CIFARFormatError",
    "read_idx", "write_idx", "IDXFormatError", "load_npz", "byte_sequences", "VOCAB_SIZE",
    "DatasetNotFoundError", "cache_dir", "candidate_dirs", "find_files",
]

"""Device-resident data sources and loaders for local dataset files."""
from tasks.datasets.data_source import SPLITS, DataSource, from_arrays
from tasks.datasets.digits import digits

__all__ = ["SPLITS", "DataSource", "from_arrays", "digits"]

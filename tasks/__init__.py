"""Inner problems for learned optimizers: Task, TaskFamily, data sources and built-in tasks."""
from tasks import datasets
from tasks.base import (Task, TaskFamily, accuracy, classification_normalizer, single_task_family,
                        softmax_cross_entropy)
from tasks.datasets import DataSource
from tasks.image_mlp import ImageMLPFamily, ImageMLPTask
from tasks.quadratics import QuadraticFamily, QuadraticTask
from tasks.registry import dataset_names, get_dataset, register_dataset

__all__ = [
    "Task", "TaskFamily", "single_task_family", "DataSource", "datasets",
    "QuadraticTask", "QuadraticFamily", "ImageMLPTask", "ImageMLPFamily",
    "classification_normalizer", "softmax_cross_entropy", "accuracy",
    "get_dataset", "register_dataset", "dataset_names",
]

"""Inner problems for learned optimizers: Task, TaskFamily, data sources, built-in tasks,
sampled task families and task augmentations."""
from tasks import datasets, suites
from tasks.adapters import task_from_flax, task_from_haiku
from tasks.autoencoder import AutoencoderFamily, AutoencoderTask
from tasks.augment import GradientNoise, NormalizeByInitialLoss, ReducedBatchSize, ScaleReparam
from tasks.base import (Task, TaskFamily, accuracy, classification_normalizer, scaled_normalizer,
                        single_task_family, softmax_cross_entropy)
from tasks.conv import ConvFamily, ConvTask
from tasks.conv_bn import ConvBNFamily, ConvBNTask
from tasks.datasets import DataSource
from tasks.families import (sample_augmentation, sample_byte_lm, sample_conv, sample_family_for_period,
                            sample_function2d,
                            sample_image_mlp, sample_linear_regression, sample_quadratic, sample_task_family)
from tasks.functions2d import Function2DFamily, Function2DTask, RosenbrockTask
from tasks.image_mlp import ImageMLPFamily, ImageMLPTask
from tasks.language import ByteLMFamily, ByteLMTask, ByteLSTMTask, ByteTransformerTask
from tasks.quadratics import QuadraticFamily, QuadraticTask
from tasks.registry import dataset_names, get_dataset, register_dataset
from tasks.regression import LinearRegressionFamily, LinearRegressionTask
from tasks.small_data import SmallDataMLPFamily, few_examples

__all__ = [
    "Task", "TaskFamily", "single_task_family", "DataSource", "datasets", "suites",
    "QuadraticTask", "QuadraticFamily", "LinearRegressionTask", "LinearRegressionFamily",
    "ImageMLPTask", "ImageMLPFamily", "ConvTask", "ConvFamily", "ConvBNTask", "ConvBNFamily", "AutoencoderTask", "AutoencoderFamily",
    "SmallDataMLPFamily", "few_examples",
    "ByteLMTask", "ByteLMFamily", "ByteTransformerTask", "ByteLSTMTask",
    "Function2DTask", "Function2DFamily", "RosenbrockTask",
    "task_from_haiku", "task_from_flax",
    "ScaleReparam", "ReducedBatchSize", "GradientNoise", "NormalizeByInitialLoss",
    "sample_image_mlp", "sample_conv", "sample_quadratic", "sample_linear_regression", "sample_function2d",
    "sample_byte_lm", "sample_augmentation", "sample_task_family", "sample_family_for_period",
    "classification_normalizer", "scaled_normalizer", "softmax_cross_entropy", "accuracy",
    "get_dataset", "register_dataset", "dataset_names",
]

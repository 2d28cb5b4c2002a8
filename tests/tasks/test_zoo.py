"""Every built-in task family, adapter and augmentation through the shared checks."""
import flax.linen as nn
import haiku as hk
import jax
import pytest
from flax import nnx

import tasks
from tasks.datasets import byte_sequences, signals1d
from tests.conftest import requires_dataset
from tests.tasks.task_checks import check_family

TEXT = (b"the quick brown fox jumps over the lazy dog. " * 20 + b"pack my box with five dozen liquor jugs! " * 20)


@pytest.fixture(scope="module")
def data():
    return {"digits": tasks.get_dataset("digits", 16), "signals": signals1d(16, num_examples=500),
            "text": byte_sequences(TEXT, 4, seq_len=16)}


def ce(out, batch):
    return tasks.softmax_cross_entropy(out, batch["label"])


class _Linen(nn.Module):
    @nn.compact
    def __call__(self, x, train=True):
        x = nn.Dense(16)(x.reshape(x.shape[0], -1))
        x = nn.BatchNorm(use_running_average=not train)(x)
        x = nn.Dropout(0.1, deterministic=not train)(nn.relu(x))
        return nn.Dense(10)(x)


class _NNX(nnx.Module):
    def __init__(self, rngs):
        self.hidden = nnx.Linear(64, 16, rngs=rngs)
        self.bn = nnx.BatchNorm(16, rngs=rngs)
        self.out = nnx.Linear(16, 10, rngs=rngs)

    def __call__(self, x):
        return self.out(nnx.relu(self.bn(self.hidden(x.reshape(x.shape[0], -1)))))


def _haiku_bn(x, is_training):
    x = hk.Linear(16)(hk.Flatten()(x))
    return hk.Linear(10)(jax.nn.relu(hk.BatchNorm(True, True, 0.9)(x, is_training)))


FAMILIES = {
    "quadratic": lambda d: tasks.QuadraticFamily(10, noise_std=0.1, normalize=True),
    "linear_regression": lambda d: tasks.LinearRegressionFamily(5, batch_size=16, num_examples=256),
    "rosenbrock": lambda d: tasks.Function2DFamily("rosenbrock"),
    "mlp_digits_layernorm": lambda d: tasks.ImageMLPFamily(d["digits"], (16, 16), norm="layer"),
    "mlp_digits_batchnorm": lambda d: tasks.ImageMLPFamily(d["digits"], (16,), norm="batch"),
    "small_data_mlp_digits": lambda d: tasks.SmallDataMLPFamily(d["digits"], 100, 0.2, hidden_sizes=(32,)),
    "conv_digits": lambda d: tasks.ConvFamily(d["digits"], (4, 8)),
    "conv_signals": lambda d: tasks.ConvFamily(d["signals"], (4,)),
    "conv_bn_digits": lambda d: tasks.ConvBNFamily(d["digits"], (4, 8), dropout=0.2),
    "byte_transformer": lambda d: tasks.ByteLMFamily(d["text"], "transformer", d_model=16, num_heads=2),
    "byte_lstm": lambda d: tasks.ByteLMFamily(d["text"], "lstm", hidden_size=16, embed_dim=8),
    "haiku_adapter_state": lambda d: tasks.single_task_family(tasks.task_from_haiku(
        _haiku_bn, ce, d["digits"], apply_kwargs={"is_training": True})),
    "linen_adapter": lambda d: tasks.single_task_family(tasks.task_from_flax(
        _Linen(), ce, d["digits"], apply_kwargs={"train": True})),
    "nnx_adapter": lambda d: tasks.single_task_family(tasks.task_from_flax(lambda rngs: _NNX(rngs), ce, d["digits"])),
    "aug_reparam": lambda d: tasks.ScaleReparam(tasks.ImageMLPFamily(d["digits"], (16,), activations=("relu",))),
    "aug_gradnoise": lambda d: tasks.GradientNoise(tasks.QuadraticFamily(5, normalize=True)),
    "aug_batch": lambda d: tasks.ReducedBatchSize(tasks.ImageMLPFamily(d["digits"], (16,), activations=("relu",)), 4),
    "aug_initnorm": lambda d: tasks.NormalizeByInitialLoss(tasks.LinearRegressionFamily(5, batch_size=16)),
    "aug_stacked": lambda d: tasks.NormalizeByInitialLoss(tasks.GradientNoise(tasks.ScaleReparam(
        tasks.ConvFamily(d["signals"], (4,), activations=("relu",))))),
}


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family(name, data, compile_counter):
    check_family(FAMILIES[name](data), compile_counter)


@requires_dataset("fashion_mnist")
def test_fashion_mnist_family(compile_counter):
    check_family(tasks.ImageMLPFamily("fashion_mnist", (16,), batch_size=16), compile_counter)


def test_sampled_families_pass_checks(data, compile_counter):
    """Three host-sampled static configs (small ones) through the same checks."""
    for seed in (0, 1):
        fam = tasks.sample_task_family(seed, samplers=(tasks.sample_quadratic, tasks.sample_linear_regression,
                                                       tasks.sample_function2d))
        check_family(fam, compile_counter)

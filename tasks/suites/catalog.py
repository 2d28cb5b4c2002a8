"""The built-in suites (see `tasks.suites`): their tasks, declared by static config, budget and seeds."""
from __future__ import annotations

import dataclasses
import inspect

from tasks.language import ByteLMTask
from tasks.suites.suite_task import _LM_ARCH, SuiteTask, _canonical


def _mlp(name, dataset, hidden, act, batch, steps, norm=None):
    return SuiteTask(name, "image_mlp", dataset, batch,
                     (("activation", act), ("hidden_sizes", tuple(hidden)), ("norm", norm)), steps)


def _conv(name, dataset, channels, act, batch, steps, kernel=3):
    return SuiteTask(name, "conv", dataset, batch,
                     (("activation", act), ("channels", tuple(channels)), ("kernel_size", kernel)), steps)


def _conv_bn(name, dataset, channels, act, batch, steps, kernel=3, dropout=0.1):
    return SuiteTask(name, "conv_bn", dataset, batch, (("activation", act), ("channels", tuple(channels)),
                                                       ("dropout", float(dropout)), ("kernel_size", kernel)), steps)


def _autoencoder(name, dataset, hidden, act, batch, steps):
    return SuiteTask(name, "autoencoder", dataset, batch, (("activation", act), ("hidden_sizes", tuple(hidden))), steps)


def _lm(name, model, batch, steps, seq_len=32, text="grammar_text", **kw):
    defaults = {k: p.default for k, p in inspect.signature(ByteLMTask.__init__).parameters.items()
                if k in _LM_ARCH[model]}
    return SuiteTask(name, "byte_lm", text, batch,
                     _canonical({"model": model, "seq_len": seq_len, **defaults, **kw}), steps)


def _regression(name, dim, batch, steps, condition, noise_std=0.1, data_seed=17):
    return SuiteTask(name, "linear_regression", f"regression_dim{dim}", batch, (("dim", dim),), steps,
                     options=_canonical({"condition": float(condition), "noise_std": float(noise_std),
                                         "data_seed": data_seed}))


_HELDOUT_CPU = (
    _mlp("digits_mlp_64x64_tanh", "digits", (64, 64), "tanh", 64, 600),
    _mlp("digits_mlp_256_relu_b32", "digits", (256,), "relu", 32, 1000),
    _conv("digits_conv_8x16_relu", "digits", (8, 16), "relu", 64, 300),
    _mlp("signals_mlp_128x128x128_gelu", "signals1d", (128, 128, 128), "gelu", 128, 1000),
    _mlp("signals_mlp_48_swish_layernorm", "signals1d", (48,), "swish", 64, 600, norm="layer"),
    _conv("signals_conv1d_16x32_relu", "signals1d", (16, 32), "relu", 64, 600, kernel=5),
    _mlp("fmnist14_mlp_128_relu", "fashion_mnist_14", (128,), "relu", 128, 2000),
    _mlp("fmnist14_mlp_96x48_tanh_b32", "fashion_mnist_14", (96, 48), "tanh", 32, 800),
    _conv("fmnist14_conv_8x16_gelu", "fashion_mnist_14", (8, 16), "gelu", 32, 400),
    _lm("text_transformer_d32", "transformer", 16, 800, d_model=32, num_heads=2, num_layers=1),
    _lm("text_lstm_h48", "lstm", 16, 400, embed_dim=16, hidden_size=48),
    _regression("regression_dim100_cond1000", 100, 32, 1000, condition=1000.0),
    # convnets with BatchNorm (running statistics as model state) and dropout: the most common vision model
    _conv_bn("digits_convbn_16x32_relu_drop0.2", "digits", (16, 32), "relu", 64, 500, dropout=0.2),
    _conv_bn("fmnist14_convbn_8x16x32_gelu_drop0.1_b32", "fashion_mnist_14", (8, 16, 32), "gelu", 32, 600, dropout=0.1),
)

_MNIST = (
    _mlp("mnist14_mlp_64x64_relu", "mnist_14", (64, 64), "relu", 64, 800),
    _conv("mnist14_conv_8x16_relu", "mnist_14", (8, 16), "relu", 32, 400),
)

_SMOKE = (
    dataclasses.replace(_mlp("smoke_digits_mlp_16_tanh", "digits", (16,), "tanh", 32, 60), seeds=(0, 1)),
    dataclasses.replace(_regression("smoke_regression_dim8", 8, 16, 40, condition=10.0), seeds=(0, 1)),
    dataclasses.replace(_conv("smoke_signals_conv1d_4", "signals1d", (4,), "relu", 16, 30), seeds=(0, 1)),
)

_VALIDATION_CPU = (
    _mlp("val_digits_mlp_128_gelu", "digits", (128,), "gelu", 64, 500),
    _mlp("val_signals_mlp_64x64_relu_b32", "signals1d", (64, 64), "relu", 32, 500),
    _mlp("val_fmnist7_mlp_64_tanh", "fashion_mnist_7", (64,), "tanh", 64, 600),
    _conv("val_signals_conv1d_8x16_gelu", "signals1d", (8, 16), "gelu", 64, 400),
    _lm("val_text_lstm_h32", "lstm", 16, 300, embed_dim=16, hidden_size=32),
    _regression("val_regression_dim50_cond100", 50, 32, 500, condition=100.0),
)

# validation-cpu's tasks at 10 000 steps: for choosing what concerns long runs (checkpoints, deployment
# options) on tasks that are not the long-horizon test suites'.
_VALIDATION_LONG_CPU = tuple(
    dataclasses.replace(t, name=t.name.replace("val_", "val10k_", 1), num_steps=10_000) for t in _VALIDATION_CPU)

# 10 000-20 000 steps each: 5-10x the longest meta-training horizon of the shipped optimizers
# (the 2000-step maximum unroll of scripts/configs/pretrained_*.gin). Built-in data only.
_LONG_HORIZON_CPU = (
    _autoencoder("long_digits_autoencoder_32x8x32_relu", "digits", (32, 8, 32), "relu", 64, 20_000),
    _autoencoder("long_signals_autoencoder_32x8x32_gelu", "signals1d", (32, 8, 32), "gelu", 64, 10_000),
    _mlp("long_digits_mlp_64_relu", "digits", (64,), "relu", 64, 10_000),
    _mlp("long_digits_mlp_32x32_tanh_b32", "digits", (32, 32), "tanh", 32, 10_000),
    _mlp("long_signals_mlp_64x32_gelu", "signals1d", (64, 32), "gelu", 64, 10_000),
    _conv("long_digits_conv_8x8_relu_b32", "digits", (8, 8), "relu", 32, 10_000),
    _regression("long_regression_dim200_cond10000", 200, 64, 20_000, condition=1e4),
)

# long-horizon-cpu's tasks at 5x their budgets (50 000-100 000 steps): >= 5x a 10 000-step horizon.
_LONG_HORIZON_50K_CPU = tuple(
    dataclasses.replace(t, name=t.name.replace("long_", "long50k_", 1), num_steps=5 * t.num_steps)
    for t in _LONG_HORIZON_CPU)

# Byte LMs of several sizes on the two procedural texts of tasks.suites.texts.
_LM_CPU = (
    _lm("lm_grammar_transformer_d16", "transformer", 16, 1000, d_model=16, num_heads=2, num_layers=1),
    _lm("lm_grammar_transformer_d48_l2_b8", "transformer", 8, 1000, d_model=48, num_heads=4, num_layers=2),
    _lm("lm_grammar_lstm_h96", "lstm", 16, 800, embed_dim=32, hidden_size=96),
    _lm("lm_arith_transformer_d32_l2", "transformer", 16, 1000, text="arithmetic_text", d_model=32, num_heads=2,
        num_layers=2),
    _lm("lm_arith_lstm_h64", "lstm", 16, 600, text="arithmetic_text", embed_dim=16, hidden_size=64),
)


def _wider(t: SuiteTask, factor: int) -> SuiteTask:
    arch = {**dict(t.arch), "hidden_sizes": tuple(factor * h for h in dict(t.arch)["hidden_sizes"])}
    return dataclasses.replace(t, name=f"{t.name}_x{factor}wide", arch=_canonical(arch))


def _deeper(t: SuiteTask, factor: int) -> SuiteTask:
    arch = {**dict(t.arch), "hidden_sizes": tuple(h for h in dict(t.arch)["hidden_sizes"] for _ in range(factor))}
    return dataclasses.replace(t, name=f"{t.name}_x{factor}deep", arch=_canonical(arch))


def _scaled_mlps(suite: tuple[SuiteTask, ...]) -> tuple[SuiteTask, ...]:
    """`suite`'s image MLPs with every hidden layer 4x wider, then with every hidden layer repeated 3x
    (3x deeper); the same datasets, batch sizes and budgets."""
    mlps = tuple(t for t in suite if t.kind == "image_mlp")
    return tuple(_wider(t, 4) for t in mlps) + tuple(_deeper(t, 3) for t in mlps)


_SCALING_CPU = _scaled_mlps(_HELDOUT_CPU)
# validation-cpu's scaled MLPs: for choosing what concerns wider and deeper nets (checkpoints, recipe
# variants) on tasks that are not scaling-cpu's.
_VALIDATION_SCALING_CPU = _scaled_mlps(_VALIDATION_CPU)

# Smooth-activation and LayerNorm MLPs on signals1d, 4x wider and 3x deeper: the kind of scaling-cpu
# task (a GELU or a swish-LayerNorm MLP on signals1d, wide or deep) that no other validation suite has,
# for choosing what concerns over-fitting of wide and deep nets on a small noisy dataset. Not a test
# suite's static config.
_VALIDATION_SIGNALS_CPU = _scaled_mlps((
    _mlp("val_signals_mlp_96x96_gelu", "signals1d", (96, 96), "gelu", 64, 800),
    _mlp("val_signals_mlp_32_swish_layernorm_b32", "signals1d", (32,), "swish", 32, 600, norm="layer"),
))

# Convnets on digits, fashion-mnist (7x7) and signals1d, of widths, depths, activations and batch sizes
# no test suite uses: with validation-cpu's one convnet, for choosing what concerns convnets alone (e.g.
# the weight-decay rule's ratio for conv kernels). Not a test suite's static config.
_VALIDATION_CONV_CPU = (
    _conv("val_digits_conv_16_gelu_b32", "digits", (16,), "gelu", 32, 400),
    _conv("val_digits_conv_4x8x8_relu", "digits", (4, 8, 8), "relu", 64, 300),
    _conv("val_fmnist7_conv_8x16_relu", "fashion_mnist_7", (8, 16), "relu", 64, 400),
    _conv("val_signals_conv1d_32_relu_b32", "signals1d", (32,), "relu", 32, 500, kernel=5),
    # BatchNorm + dropout convnets on the datasets, widths and depths heldout-cpu's do not use
    _conv_bn("val_signals_convbn1d_32_relu_drop0.1", "signals1d", (32,), "relu", 64, 400, kernel=5, dropout=0.1),
    _conv_bn("val_fmnist7_convbn_16x16_tanh_drop0.3", "fashion_mnist_7", (16, 16), "tanh", 64, 400, dropout=0.3),
)

_SUITES = {"heldout-cpu": _HELDOUT_CPU, "heldout-cpu-mnist": _HELDOUT_CPU + _MNIST, "smoke": _SMOKE,
           "validation-cpu": _VALIDATION_CPU, "validation-long-cpu": _VALIDATION_LONG_CPU,
           "validation-scaling-cpu": _VALIDATION_SCALING_CPU, "validation-signals-cpu": _VALIDATION_SIGNALS_CPU,
           "validation-conv-cpu": _VALIDATION_CONV_CPU,
           "long-horizon-cpu": _LONG_HORIZON_CPU,
           "long-horizon-50k-cpu": _LONG_HORIZON_50K_CPU, "lm-cpu": _LM_CPU,
           "scaling-cpu": _SCALING_CPU}


def names() -> list[str]:
    """The names of the built-in suites.

    Returns:
      the names, sorted.
    """
    return sorted(_SUITES)


def get(name: str) -> tuple[SuiteTask, ...]:
    """The tasks of suite `name`.

    Args:
      name: a suite name (see `names`).

    Returns:
      the suite's SuiteTasks, in report order.

    Raises:
      ValueError: an unknown name (the message lists the suites).
    """
    if name not in _SUITES:
        raise ValueError(f"unknown suite {name!r}; the suites are {names()}")
    return _SUITES[name]



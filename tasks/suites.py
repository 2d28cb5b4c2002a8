"""Evaluation suites: named, fixed lists of held-out tasks, each with its step budget and seeds::

    for t in tasks.suites.get("heldout-cpu"):
        family = t.build()              # a TaskFamily whose every draw is the same task
        ...                             # train t.num_steps steps for each seed in t.seeds

A suite task is declared by its static config (`SuiteTask.static_config`): what must differ
for a task to be held out from meta-training, i.e. what a compiled program is specialised on —
the model kind, the dataset (with its resolution), the architecture (layer sizes, kernel, norm,
activation, sequence length) and the batch size. Per-seed values (initialisation, batch order)
are not part of it. `static_configs(family)` lists every static config a (meta-training) family
can draw, and `overlaps(suite_tasks, family)` the suite tasks whose static config it can draw:
a shipped optimizer's meta-training family must have none. Neither reads a dataset file.

Suites (`names()`):

- heldout-cpu: 12 tasks sized for a 2-core CPU: MLPs of several widths and depths, convnets (1-D
  and 2-D), a transformer and an LSTM byte LM and a linear regression, on digits, signals1d,
  Fashion-MNIST (14x14) and a procedural English-like text (`grammar_text`), 300-2000 steps,
  3 seeds each. Needs the Fashion-MNIST IDX files (Debian package dataset-fashion-mnist); every
  other dataset is built without files.
- heldout-cpu-mnist: heldout-cpu plus two MNIST tasks; needs the MNIST IDX files locally (without
  them `build` raises DatasetNotFoundError naming where it looked).
- validation-cpu: 6 cheaper tasks (300-600 steps, 3 seeds) disjoint from heldout-cpu and from
  the shipped recipes' meta-training families, on the same datasets (Fashion-MNIST at 7x7): for
  choosing among a run's checkpoints, so heldout-cpu stays a test set nothing was selected on.
- smoke: 3 tiny tasks (at most 60 steps, 2 seeds) for tests and quick checks.

Every task is evaluated on the "test" split: the held-out loss after training is the mean
loss over batches of that split.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any, Optional, Sequence

import numpy as np

from tasks.base import TaskFamily, _SingleTaskFamily
from tasks.conv import ConvFamily
from tasks.datasets.text import byte_sequences
from tasks.functions2d import Function2DFamily
from tasks.image_mlp import ImageMLPFamily
from tasks.language import ByteLMFamily, ByteLMTask
from tasks.quadratics import QuadraticFamily
from tasks.regression import LinearRegressionFamily

__all__ = ["SuiteTask", "get", "names", "static_configs", "overlaps", "held_out_report", "grammar_text"]

METRICS = ("final_train_loss", "final_eval_loss", "time_to_reach")


@dataclasses.dataclass(frozen=True)
class SuiteTask:
    """One held-out task of a suite: its static config, step budget and seeds.

    Attributes:
      name: the task's label in reports.
      kind: "image_mlp", "conv", "byte_lm" or "linear_regression".
      dataset: a dataset name of `tasks.registry` ("digits", "signals1d", "fashion_mnist_14", ...),
        "grammar_text" (the procedural text of `grammar_text`) or "regression_dim{dim}".
      batch_size: examples per training batch.
      arch: the architecture as sorted (key, value) pairs, e.g. (("activation", "tanh"),
        ("hidden_sizes", (64, 64)), ("norm", None)); the keys `static_configs` reports for `kind`.
      num_steps: the training budget (the horizon an optimizer is told).
      seeds: one run (initialisation and batch order) per seed.
      eval_split: the data split of the held-out loss after training.
      metrics: what an evaluation reports (see outer_trainers.evaluation.protocol).
      options: build arguments that are not part of the static config, as (key, value) pairs (a
        regression's condition number, label noise and design seed).
    """

    name: str
    kind: str
    dataset: str
    batch_size: int
    arch: tuple
    num_steps: int
    seeds: tuple = (0, 1, 2)
    eval_split: str = "test"
    metrics: tuple = METRICS
    options: tuple = ()

    def static_config(self) -> tuple:
        """The task's static config, in `static_configs`' canonical form.

        Returns:
          a sorted tuple of (key, value) pairs: kind, dataset, batch_size and the `arch` entries.
        """
        return _canonical({"kind": self.kind, "dataset": self.dataset, "batch_size": self.batch_size,
                           **dict(self.arch)})

    def build(self, *, load_data: bool = True) -> TaskFamily:
        """The task as a TaskFamily whose every draw is the same task (init scale 1, one activation).

        Args:
          load_data: load the dataset now (for training or evaluation), so that a missing one is
            reported here; False builds the family's static description only, reading no file
            (its data then loads on first use of `family.data`).

        Returns:
          the TaskFamily; its `static_configs` is `[self.static_config()]`.

        Raises:
          tasks.datasets.DatasetNotFoundError: (load_data only) the dataset's files are missing;
            the message names them, the directories searched and how to get them.
        """
        family = self._family()
        if load_data:
            family.data  # the first use of `data` loads a named dataset
        return family

    def _family(self) -> TaskFamily:
        a = {**dict(self.arch), **dict(self.options)}
        if self.kind == "image_mlp":
            return ImageMLPFamily(self.dataset, a["hidden_sizes"], batch_size=self.batch_size,
                                  init_scale_range=(1.0, 1.0), activations=(a["activation"],), norm=a["norm"])
        if self.kind == "conv":
            return ConvFamily(self.dataset, a["channels"], kernel_size=a["kernel_size"], batch_size=self.batch_size,
                              init_scale_range=(1.0, 1.0), activations=(a["activation"],))
        if self.kind == "byte_lm":
            if self.dataset != "grammar_text":
                raise ValueError(f"suite task {self.name}: byte LMs run on 'grammar_text', got {self.dataset!r}")
            model_kwargs = {k: v for k, v in a.items() if k not in ("model", "seq_len")}
            data = _grammar_source(self.batch_size, a["seq_len"])
            return ByteLMFamily(data, a["model"], init_scale_range=(1.0, 1.0), **model_kwargs)
        if self.kind == "linear_regression":
            return LinearRegressionFamily(a["dim"], batch_size=self.batch_size, condition=a["condition"],
                                          noise_range=(a["noise_std"], a["noise_std"]), seed=a["data_seed"])
        raise ValueError(f"suite task {self.name}: unknown kind {self.kind!r}")


def _canonical(config: dict) -> tuple:
    """A static config as a hashable, order-independent value: sorted (key, value) pairs, lists as tuples."""
    fix = lambda v: tuple(fix(x) for x in v) if isinstance(v, (list, tuple)) else v
    return tuple(sorted((str(k), fix(v)) for k, v in config.items()))


def _mlp(name, dataset, hidden, act, batch, steps, norm=None):
    return SuiteTask(name, "image_mlp", dataset, batch,
                     (("activation", act), ("hidden_sizes", tuple(hidden)), ("norm", norm)), steps)


def _conv(name, dataset, channels, act, batch, steps, kernel=3):
    return SuiteTask(name, "conv", dataset, batch,
                     (("activation", act), ("channels", tuple(channels)), ("kernel_size", kernel)), steps)


def _lm(name, model, batch, steps, seq_len=32, **kw):
    defaults = {k: p.default for k, p in inspect.signature(ByteLMTask.__init__).parameters.items()
                if k in _LM_ARCH[model]}
    return SuiteTask(name, "byte_lm", "grammar_text", batch,
                     _canonical({"model": model, "seq_len": seq_len, **defaults, **kw}), steps)


def _regression(name, dim, batch, steps, condition, noise_std=0.1, data_seed=17):
    return SuiteTask(name, "linear_regression", f"regression_dim{dim}", batch, (("dim", dim),), steps,
                     options=_canonical({"condition": float(condition), "noise_std": float(noise_std),
                                         "data_seed": data_seed}))


_LM_ARCH = {"transformer": ("d_model", "num_heads", "num_layers"), "lstm": ("embed_dim", "hidden_size")}

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

_SUITES = {"heldout-cpu": _HELDOUT_CPU, "heldout-cpu-mnist": _HELDOUT_CPU + _MNIST, "smoke": _SMOKE,
           "validation-cpu": _VALIDATION_CPU}


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


_NOUNS = ("optimizer", "network", "river", "teacher", "garden", "signal", "window", "planet", "student",
          "engine", "forest", "letter", "market", "village", "machine", "question", "picture", "island")
_VERBS = ("sees", "builds", "follows", "carries", "finds", "measures", "opens", "trains", "paints", "answers",
          "crosses", "remembers", "moves", "writes")
_ADJECTIVES = ("small", "quiet", "bright", "old", "careful", "green", "strange", "heavy", "quick", "distant")
_ADVERBS = ("slowly", "often", "never", "gladly", "again", "together")
_PREPOSITIONS = ("near", "under", "behind", "with", "across", "beyond")


def grammar_text(num_bytes: int = 200_000, *, seed: int = 1234) -> bytes:
    """Procedural English-like text from a small stochastic grammar (the suite's byte-LM corpus).

    Sentences are "Det [Adj] Noun [Adv] Verb Det [Adj] Noun [Prep Det Noun]." with words drawn
    uniformly from fixed lists, capitalised, sometimes joined by ", and". Same seed, same bytes:
    no file, no download, and the text is identical on every machine.

    Args:
      num_bytes: the length of the text (it is cut to exactly this many bytes).
      seed: the numpy seed of the draws.

    Returns:
      the ASCII text.
    """
    rng = np.random.default_rng(seed)
    pick = lambda words: words[int(rng.integers(len(words)))]

    def phrase():
        words = [pick(("the", "a", "every", "one"))]
        if rng.random() < 0.5:
            words.append(pick(_ADJECTIVES))
        words.append(pick(_NOUNS))
        return words

    out, size = [], 0
    while size < num_bytes:
        words = phrase() + ([pick(_ADVERBS)] if rng.random() < 0.3 else []) + [pick(_VERBS)] + phrase()
        if rng.random() < 0.3:
            words += [pick(_PREPOSITIONS)] + phrase()
        if rng.random() < 0.2:
            words += [", and"] + phrase() + [pick(_VERBS)] + phrase()
        sentence = " ".join(words).replace(" ,", ",")
        sentence = sentence[0].upper() + sentence[1:] + ". "
        out.append(sentence)
        size += len(sentence)
    return "".join(out).encode("ascii")[:num_bytes]


@functools.lru_cache(maxsize=None)
def _grammar_source(batch_size: int, seq_len: int):
    return byte_sequences(grammar_text(), batch_size, seq_len=seq_len, name="grammar_text")


def static_configs(family: Any) -> list[tuple]:
    """Every static config (see the module docstring) a task family can draw.

    A family (or mixture) of any class may report its own by a `static_configs()` method returning
    dicts; the built-in families are read here: image MLPs (one config per activation choice),
    convnets, byte LMs, linear regressions, quadratics and 2-D functions; augmentation wrappers
    report their inner family's, `ReducedBatchSize` with its batch size; an object with a
    `families` sequence (a mixture) reports the union of its members'. No dataset is loaded: the
    built-in families state their dataset, batch size and architecture without their data.

    Args:
      family: a TaskFamily (a single Task lifted by `single_task_family` has none here).

    Returns:
      the distinct configs, each a sorted tuple of (key, value) pairs (`SuiteTask.static_config`'s form).

    Raises:
      TypeError: a family whose static configs cannot be told (the message says what to add).
    """
    found = _static_configs(family)
    return list(dict.fromkeys(found))


def _static_configs(family: Any) -> list[tuple]:
    from tasks import augment  # the wrappers share one private base; import here to keep it local
    own = getattr(family, "static_configs", None)
    if callable(own):
        return [c if isinstance(c, tuple) else _canonical(c) for c in own()]
    if isinstance(family, ImageMLPFamily):
        return [_canonical({"kind": "image_mlp", "dataset": family.dataset, "batch_size": family.batch_size,
                            "hidden_sizes": family.hidden_sizes, "norm": family.norm, "activation": act})
                for act in family.activations]
    if isinstance(family, ConvFamily):
        return [_canonical({"kind": "conv", "dataset": family.dataset, "batch_size": family.batch_size,
                            "channels": family.channels, "kernel_size": family.kernel_size, "activation": act})
                for act in family.activations]
    if isinstance(family, ByteLMFamily):
        seq_len = int(family.data.element_spec("train")["tokens"].shape[1])
        defaults = {k: p.default for k, p in inspect.signature(ByteLMTask.__init__).parameters.items()
                    if k in _LM_ARCH[family.model]}
        return [_canonical({"kind": "byte_lm", "dataset": family.data.name, "batch_size": family.data.batch_size,
                            "model": family.model, "seq_len": seq_len, **defaults,
                            **{k: v for k, v in family.model_kwargs.items() if k in _LM_ARCH[family.model]}})]
    if isinstance(family, LinearRegressionFamily):
        return [_canonical({"kind": "linear_regression", "dataset": family.data.name,
                            "batch_size": family.data.batch_size, "dim": family.dim})]
    if isinstance(family, QuadraticFamily):
        return [_canonical({"kind": "quadratic", "dim": family.dim})]
    if isinstance(family, Function2DFamily):
        return [_canonical({"kind": "function2d", "function": family.function})]
    if isinstance(family, augment.ReducedBatchSize):
        return [_canonical({**dict(c), "batch_size": family.batch_size})
                for c in _static_configs(family.family) if "batch_size" in dict(c)] + \
               [c for c in _static_configs(family.family) if "batch_size" not in dict(c)]
    if isinstance(family, TaskFamily) and isinstance(getattr(family, "family", None), TaskFamily):
        return _static_configs(family.family)  # ScaleReparam, GradientNoise, NormalizeByInitialLoss, ...
    members = getattr(family, "families", None)
    if isinstance(members, (list, tuple)) and members:
        return [c for member in members for c in _static_configs(member)]
    if isinstance(family, _SingleTaskFamily):
        raise TypeError(f"static_configs: {family.name} is a single Task lifted to a family; a bare Task has no "
                        f"static config here — use the task's family, or give it a static_configs() method")
    raise TypeError(f"static_configs: cannot tell the static configs of {type(family).__name__} "
                    f"({getattr(family, 'name', family)!r}); give it a static_configs() method returning dicts "
                    f"such as {{'kind': ..., 'dataset': ..., 'batch_size': ..., <architecture>}}")


def overlaps(suite_tasks: Sequence[SuiteTask], family: Any) -> list[str]:
    """The suite tasks that `family` can draw: their static config is one of `static_configs(family)`.

    Args:
      suite_tasks: the suite (e.g. `get("heldout-cpu")`).
      family: a meta-training task family.

    Returns:
      the names of the overlapping suite tasks (empty: the suite is held out from `family`).
    """
    drawn = set(static_configs(family))
    return [t.name for t in suite_tasks if t.static_config() in drawn]


def held_out_report(suite_tasks: Sequence[SuiteTask], families: dict) -> Optional[str]:
    """A message naming every (family, suite task) overlap, or None when the suite is held out from all.

    Args:
      suite_tasks: the suite.
      families: {label (e.g. a config file): meta-training TaskFamily}.

    Returns:
      None, or "suite tasks drawn by meta-training families: LABEL: task, task; ...".
    """
    bad = {label: overlaps(suite_tasks, fam) for label, fam in families.items()}
    bad = {k: v for k, v in bad.items() if v}
    if not bad:
        return None
    return "suite tasks drawn by meta-training families: " + "; ".join(f"{k}: {', '.join(v)}" for k, v in bad.items())

"""SuiteTask: one held-out task of an evaluation suite, declared by its static config, with its
step budget and seeds; `build` makes it a TaskFamily whose every draw is that task.

The static config (`SuiteTask.static_config`) is what must differ for a task to be held out
from meta-training: what a compiled program is specialised on (the model kind, the dataset with
its resolution, the architecture and the batch size), in the canonical form `_canonical` gives,
the one `tasks.suites.static_configs` reports for a family.
"""
from __future__ import annotations

import dataclasses

from tasks.autoencoder import AutoencoderFamily
from tasks.base import TaskFamily
from tasks.conv import ConvFamily
from tasks.conv_bn import ConvBNFamily
from tasks.image_mlp import ImageMLPFamily
from tasks.language import ByteLMFamily
from tasks.regression import LinearRegressionFamily
from tasks.suites.texts import TEXTS, _text_source

METRICS = ("final_train_loss", "final_eval_loss", "time_to_reach")
# The architecture keys of a byte LM's static config, per model.
_LM_ARCH = {"transformer": ("d_model", "num_heads", "num_layers"), "lstm": ("embed_dim", "hidden_size")}

@dataclasses.dataclass(frozen=True)
class SuiteTask:
    """One held-out task of a suite: its static config, step budget and seeds.

    Attributes:
      name: the task's label in reports.
      kind: "image_mlp", "conv", "conv_bn" (a convnet with BatchNorm and dropout), "autoencoder", "byte_lm"
        or "linear_regression".
      dataset: a dataset name of `tasks.registry` ("digits", "signals1d", "fashion_mnist_14", ...),
        a procedural text of `tasks.suites.texts.TEXTS` ("grammar_text", "arithmetic_text") or
        "regression_dim{dim}".
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
        if self.kind == "conv_bn":
            return ConvBNFamily(self.dataset, a["channels"], kernel_size=a["kernel_size"], dropout=a["dropout"],
                                batch_size=self.batch_size, init_scale_range=(1.0, 1.0), activations=(a["activation"],))
        if self.kind == "autoencoder":
            return AutoencoderFamily(self.dataset, a["hidden_sizes"], batch_size=self.batch_size,
                                     init_scale_range=(1.0, 1.0), activations=(a["activation"],))
        if self.kind == "byte_lm":
            if self.dataset not in TEXTS:
                raise ValueError(f"suite task {self.name}: byte LMs run on one of {sorted(TEXTS)}, got {self.dataset!r}")
            model_kwargs = {k: v for k, v in a.items() if k not in ("model", "seq_len")}
            data = _text_source(self.dataset, self.batch_size, a["seq_len"])
            return ByteLMFamily(data, a["model"], init_scale_range=(1.0, 1.0), **model_kwargs)
        if self.kind == "linear_regression":
            return LinearRegressionFamily(a["dim"], batch_size=self.batch_size, condition=a["condition"],
                                          noise_range=(a["noise_std"], a["noise_std"]), seed=a["data_seed"])
        raise ValueError(f"suite task {self.name}: unknown kind {self.kind!r}")


def _canonical(config: dict) -> tuple:
    """A static config as a hashable, order-independent value: sorted (key, value) pairs, lists as tuples."""
    fix = lambda v: tuple(fix(x) for x in v) if isinstance(v, (list, tuple)) else v
    return tuple(sorted((str(k), fix(v)) for k, v in config.items()))

"""What a task family can draw, compared with the suites: `static_configs(family)` lists every
static config (see `tasks.suites.suite_task`) a family can draw, `overlaps(suite, family)` the
suite tasks among them, `held_out_report(suite, families)` every overlap of several families.
None of them reads a dataset file: the built-in families state their dataset, batch size and
architecture without their data.
"""
from __future__ import annotations

import inspect
from typing import Any, Optional, Sequence

from tasks.autoencoder import AutoencoderFamily
from tasks.base import TaskFamily, _SingleTaskFamily
from tasks.conv import ConvFamily
from tasks.functions2d import Function2DFamily
from tasks.image_mlp import ImageMLPFamily
from tasks.language import ByteLMFamily, ByteLMTask
from tasks.quadratics import QuadraticFamily
from tasks.regression import LinearRegressionFamily
from tasks.suites.suite_task import _LM_ARCH, SuiteTask, _canonical


def static_configs(family: Any) -> list[tuple]:
    """Every static config (see the module docstring) a task family can draw.

    A family (or mixture) of any class may report its own by a `static_configs()` method returning
    dicts; the built-in families are read here: image MLPs, convnets and MLP autoencoders (one
    config per activation choice), byte LMs, linear regressions, quadratics and 2-D functions;
    augmentation wrappers report their inner family's, `ReducedBatchSize` with its batch size; an
    object with a `families` sequence (a mixture) reports the union of its members'. No dataset is
    loaded: the built-in families state their dataset, batch size and architecture without their data.

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
    if isinstance(family, AutoencoderFamily):
        return [_canonical({"kind": "autoencoder", "dataset": family.dataset, "batch_size": family.batch_size,
                            "hidden_sizes": family.hidden_sizes, "activation": act})
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

"""The one place that makes lopt configurable with gin.

`import outer_trainers.gin_registry` registers every public class and function of `lopt`,
`tasks` and `outer_trainers` (under their own names, e.g. `TruncatedPES.std = 0.01`, or
with the package as module, `outer_trainers.TruncatedPES.std`), plus the optax optimizers
and transforms that outer-optimizer configs use (`optax.adam.learning_rate = 1e-3`).
The library itself never imports gin: it runs with no config parsed.
"""
from __future__ import annotations

import inspect

import gin
import optax

import lopt
import outer_trainers
import tasks

OPTAX_NAMES = ("adam", "adamw", "sgd", "rmsprop", "lion", "adafactor", "chain", "clip_by_global_norm", "clip",
               "scale", "scale_by_adam", "add_decayed_weights", "cosine_decay_schedule",
               "warmup_cosine_decay_schedule", "exponential_decay", "MultiSteps")

_SKIP = {"gin_registry"}
_registered = False


def _is_configurable(obj) -> bool:
    if inspect.isclass(obj):
        # State containers are data, not configuration.
        return not hasattr(obj, "__dataclass_fields__") or hasattr(obj, "__post_init__")
    return inspect.isfunction(obj)


def register_all() -> None:
    """Registers the public API with gin (idempotent)."""
    global _registered
    if _registered:
        return
    for package in (lopt, tasks, outer_trainers):
        for name in getattr(package, "__all__", []):
            obj = getattr(package, name)
            if name in _SKIP or not _is_configurable(obj):
                continue
            gin.external_configurable(obj, name=name, module=package.__name__)
    for name in OPTAX_NAMES:
        if hasattr(optax, name):
            gin.external_configurable(getattr(optax, name), name=name, module="optax")
    _registered = True


register_all()

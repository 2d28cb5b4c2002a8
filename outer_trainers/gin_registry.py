"""The one place that makes lopt configurable with gin.

`import outer_trainers.gin_registry` registers the public API of `lopt`, `tasks` and
`outer_trainers` (every name in their `__all__`) under its own name, e.g.
`TruncatedPES.std = 0.01` or `x = @NeverEndingTruncationSchedule()`, and with the package as
module, `outer_trainers.TruncatedPES.std`; plus the optax optimizers and transforms that
outer-optimizer configs use (`optax.adam.learning_rate = 1e-3`). gin cannot bind `optax.chain`'s
varargs; `outer_trainers.chained` takes the list, so a gin file clips the outer gradient with
`train.outer_opt = @chained()` and `chained.transforms = [@optax.clip_by_global_norm(), @optax.adam()]`.

What is registered: every public class except state containers, and every public function.
State containers are the pytrees that carry values between steps or out of a run, not settings:
`flax.struct.dataclass`es (`LearnerState`, `StepOut`, `TruncationState`, ...) and NamedTuples
(optimizer states such as `MLPLOptState`, `TrainResult`). A plain (frozen) `dataclasses.dataclass`
such as a truncation schedule or `CheckpointPolicy` is configuration and is registered.

`load_config` parses gin files and bindings for the scripts, with their error handling.
`learner.gin_run` holds the gin-configured meta-training run (`train`) of scripts/outer_train.py
and the run description Ray workers rebuild from gin text.
Only this module and `learner.gin_run` import gin, and `import outer_trainers` imports neither:
the library runs with no config parsed.
"""
from __future__ import annotations

import inspect
import os
import re
import sys
from typing import Any, Sequence

import gin
import optax

import lopt
import outer_trainers
import tasks

OPTAX_NAMES = ("adam", "adamw", "sgd", "rmsprop", "lion", "adafactor", "chain", "clip_by_global_norm", "clip",
               "scale", "scale_by_adam", "add_decayed_weights", "cosine_decay_schedule",
               "warmup_cosine_decay_schedule", "exponential_decay", "MultiSteps")
PACKAGES = (lopt, tasks, outer_trainers)

_registered = False


def is_state_container(obj: Any) -> bool:
    """Whether `obj` is a state-container class: a `flax.struct.dataclass` or a NamedTuple.

    Args:
      obj: any object (a name of a package's `__all__`).

    Returns:
      True for the pytree classes that hold values (states, step outputs, results), which gin
      does not register; False for everything else, classes used as configuration included.
    """
    if not inspect.isclass(obj):
        return False
    is_flax_struct = bool(getattr(obj, "_flax_dataclass", False))
    is_named_tuple = issubclass(obj, tuple) and hasattr(obj, "_fields")
    return is_flax_struct or is_named_tuple


def is_configurable(obj: Any) -> bool:
    """Whether `register_all` registers `obj` with gin: a class that is not a state container, or a function.

    Args:
      obj: any object (a name of a package's `__all__`).

    Returns:
      True for configuration classes and public functions; False for state containers, modules
      and other values.
    """
    if inspect.isclass(obj):
        return not is_state_container(obj)
    return inspect.isfunction(obj)


def register_all() -> None:
    """Registers the public API of `PACKAGES` and the optax names in `OPTAX_NAMES` with gin.

    Each configurable name of a package's `__all__` (see `is_configurable`) is registered both as
    `Name` and as `package.Name`; optax's as `optax.name`. Idempotent: runs once per process
    (importing this module calls it).
    """
    global _registered
    if _registered:
        return
    for package in PACKAGES:
        for name in package.__all__:
            obj = getattr(package, name)
            if is_configurable(obj):
                gin.external_configurable(obj, name=name, module=package.__name__)
    for name in OPTAX_NAMES:
        if hasattr(optax, name):
            gin.external_configurable(getattr(optax, name), name=name, module="optax")
    _registered = True


def load_config(gin_files: Sequence[str], gin_params: Sequence[str]) -> None:
    """Parses gin config files, then bindings, into gin's global config, exiting on any error.

    For command-line scripts: a missing file exits with its name; a config gin rejects (unknown
    configurable or parameter, syntax error) prints gin's message to stderr, naming the file or
    quoting the `--gin_param` text that failed, and exits with status 2, before anything is built
    or compiled. Each file and each binding is parsed on its own so the error names its source.

    Args:
      gin_files: paths of gin files, parsed in order.
      gin_params: gin bindings such as `"train.num_steps = 10"`, parsed after the files.

    Raises:
      SystemExit: a file does not exist (status 1) or gin cannot parse the config (status 2).
    """
    for f in gin_files:
        if not os.path.exists(f):
            raise SystemExit(f"error: gin file {f!r} does not exist")
    steps = [(f"bad gin configuration in {f}", gin.parse_config_file, f) for f in gin_files]
    steps += [(f"bad --gin_param {p!r}", gin.parse_config, p) for p in gin_params]
    steps.append(("bad gin configuration (while finalizing)", lambda _: gin.finalize(), None))
    for what, parse, source in steps:
        try:
            parse(source)
        except Exception as e:  # gin raises ValueError/KeyError/SyntaxError-like errors with locations
            print(f"error: {what}:\n{e}", file=sys.stderr)
            raise SystemExit(2) from e


def gin_bindings(config_str: str, ignore: Sequence[str] = ()) -> list[str]:
    """The bindings of a gin config string, as the checkpoint's config records them for resume checks.

    Args:
      config_str: gin config text (e.g. `gin.config_str()`).
      ignore: binding-name prefixes to drop (e.g. the options a resume may change).

    Returns:
      one string per binding (continuation lines joined; comments and blank lines dropped), without
      the bindings whose name starts with a prefix in `ignore`.
    """
    out = []
    for line in config_str.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if re.match(r"^[A-Za-z_@][\w./@-]*\s*=", line) or not out or line.startswith(("import ", "from ")):
            out.append(stripped)
        else:
            out[-1] += " " + stripped
    return [b for b in out if not b.split("=")[0].strip().startswith(tuple(ignore))]


register_all()


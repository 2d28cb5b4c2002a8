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

The settings groups of the gin-configured meta-training run (`SETTINGS_GROUPS`: `MetaEval`,
`Comparison`, `Validation`, `Reporting`, `CheckpointPolicy`, `RayWorkers`) are registered too, each
under its own name: `learner.gin_run.train` builds them from their bindings
(`MetaEval.every = 100`). So are those of scripts/train.py's `fit` (`EvalPlan`, `CheckpointPolicy`) and
scripts/evaluate.py's `evaluate` (`BaselineTuning`, registered by that script). Bindings that moved
into a group are listed in `RENAMED_BINDINGS` (`train`'s) and `RENAMED_ELSEWHERE` (the others'); a
config that still uses one is refused naming the new binding.

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
from outer_trainers.distributed import RayWorkers
from outer_trainers.learner import run_settings

OPTAX_NAMES = ("adam", "adamw", "sgd", "rmsprop", "lion", "adafactor", "chain", "clip_by_global_norm", "clip",
               "scale", "scale_by_adam", "add_decayed_weights", "cosine_decay_schedule",
               "warmup_cosine_decay_schedule", "exponential_decay", "MultiSteps")
PACKAGES = (lopt, tasks, outer_trainers)
# the settings groups of `learner.gin_run.train`: {gin name: class} (those in `outer_trainers.__all__` are
# registered with it, the others by `register_all` on their own)
GROUP_CLASSES = {"MetaEval": run_settings.MetaEval, "Comparison": run_settings.Comparison,
                 "Validation": run_settings.Validation, "Reporting": run_settings.Reporting, "RayWorkers": RayWorkers,
                 "CheckpointPolicy": outer_trainers.CheckpointPolicy}
SETTINGS_GROUPS = tuple(GROUP_CLASSES)

# bindings of `train` that moved into a settings group: {old name: new name}
RENAMED_BINDINGS = {
    **{f"train.meta_eval_{k}": f"MetaEval.{k}" for k in ("every", "tasks", "num_tasks", "num_steps", "seed")},
    **{f"train.eval_{k}": f"Comparison.{k}" for k in ("num_tasks", "num_steps", "adam_lrs")},
    **{f"train.validation_{k}": f"Validation.{k}" for k in ("every", "suite", "tasks", "num_steps", "num_seeds",
                                                            "baseline", "lrs", "max_extensions")},
    "train.checkpoint_every_steps": "CheckpointPolicy.every_steps",
    "train.checkpoint_every_seconds": "CheckpointPolicy.every_seconds",
    "train.keep_checkpoints": "CheckpointPolicy.keep", "train.checkpoints_at": "CheckpointPolicy.checkpoints_at",
    "train.permanent_checkpoint_every": "CheckpointPolicy.permanent_every",
    **{f"train.{k}": f"CheckpointPolicy.{k}" for k in ("best_metric", "best_mode", "keep_best")},
    **{f"train.{k}": f"Reporting.{k}" for k in ("progress", "log_every", "tensorboard", "max_consecutive_dropped")},
    **{f"train.{k}": f"RayWorkers.{k}" for k in ("max_staleness", "num_estimates_per_step")},
    "train.ray_address": "RayWorkers.address (or --ray_address)",
    "train.config": "nothing: the recorded config is read from the gin config itself",
}
# other bindings that moved into settings groups: {old name: new name}. Unlike `train`'s, `fit`'s evaluation
# bindings are part of the config its checkpoints record, so a `fit` run resumes under the names it started with.
RENAMED_ELSEWHERE = {
    # scripts/train.py's `fit`: its evaluations and checkpoints are the groups EvalPlan and CheckpointPolicy
    "fit.eval_splits": "EvalPlan.evals", "fit.eval_every": "EvalPlan.every", "fit.eval_at": "EvalPlan.at",
    "fit.eval_batches": "EvalPlan.batches",
    "fit.checkpoint_every_steps": "CheckpointPolicy.every_steps",
    "fit.checkpoint_every_seconds": "CheckpointPolicy.every_seconds", "fit.keep_checkpoints": "CheckpointPolicy.keep",
    "fit.checkpoints_at": "CheckpointPolicy.checkpoints_at",
    "fit.permanent_checkpoint_every": "CheckpointPolicy.permanent_every",
    **{f"fit.{k}": f"CheckpointPolicy.{k}" for k in ("best_metric", "best_mode", "keep_best")},
    # scripts/evaluate.py's `evaluate`: how it tunes the baselines is the group BaselineTuning
    **{f"evaluate.{k}": f"BaselineTuning.{k}" for k in ("adam_lrs", "adamw_lrs", "muon_lrs", "sgdm_lrs", "momentum",
                                                         "weight_decay", "max_extensions")},
    # the library's loops, where a config binds them directly
    **{f"outer_train.{k}": f"Reporting.{k} (outer_train.reporting = @Reporting())"
       for k in ("progress", "log_every", "tensorboard", "max_consecutive_dropped")},
    **{f"{fn}.{k}": f"LoopOptions.{k} ({fn}.options = @LoopOptions())" for fn in ("train_loop", "train_model")
       for k in ("log_every", "progress", "tensorboard", "callbacks", "yield_every", "chunk_size")},
    **{f"{fn}.{old}": f"EvalPlan.{new} ({fn}.evaluation = @EvalPlan())" for fn in ("train_loop", "train_model")
       for old, new in (("evals", "evals"), ("eval_every", "every"), ("eval_at", "at"), ("eval_split", "split"),
                        ("eval_batches", "batches"), ("metrics", "metrics"))},
}
_ALL_RENAMED = {**RENAMED_BINDINGS, **RENAMED_ELSEWHERE}
# the configurables whose renamed bindings `renamed_bindings` looks for, longest first (`train_loop` before `train`)
_RENAMED_IN = sorted({old.split(".")[0] for old in _ALL_RENAMED}, key=len, reverse=True)
_BINDING_NAME = re.compile(r"^[ \t]*(?:[\w.]+/)*(?:[\w.]+\.)?((?:" + "|".join(_RENAMED_IN) + r")\.\w+)[ \t]*=",
                           re.MULTILINE)

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
    for name, cls in GROUP_CLASSES.items():
        if name not in outer_trainers.__all__:
            gin.external_configurable(cls, name=name, module=outer_trainers.__name__)
    _registered = True


def renamed_bindings(config_text: str) -> list[str]:
    """The bindings of `config_text` that use a parameter name that moved into a settings group, each with its
    new name (`RENAMED_BINDINGS`, `train`'s; `RENAMED_ELSEWHERE`, `fit`'s, `evaluate`'s and the library loops').

    Args:
      config_text: gin config text (a file's or a `--gin_param`'s).

    Returns:
      one line per renamed binding found, e.g. "train.log_every is now Reporting.log_every"; empty when none.
    """
    found = dict.fromkeys(m.group(1) for m in _BINDING_NAME.finditer(config_text))
    return [f"{old} is now {_ALL_RENAMED[old]}" for old in found if old in _ALL_RENAMED]


def check_renamed_bindings(config_text: str, source: str = "the gin config") -> None:
    """Refuses a config that binds a parameter that moved into a settings group, naming the new binding.

    Args:
      config_text: gin config text.
      source: what the text is, for the message (a file name, "--gin_param ...").

    Raises:
      ValueError: a binding uses an old name (e.g. a run directory's config.gin written before the rename).
    """
    renamed = renamed_bindings(config_text)
    if renamed:
        raise ValueError(f"{source} binds parameters that moved into settings groups: "
                         + "; ".join(renamed) + ". Rename the bindings (a `train` run started with the old "
                         "names resumes with the new ones).")


def load_config(gin_files: Sequence[str], gin_params: Sequence[str]) -> None:
    """Parses gin config files, then bindings, into gin's global config, exiting on any error.

    For command-line scripts: a missing file exits with its name; a config gin rejects (unknown
    configurable or parameter, syntax error) prints gin's message to stderr, naming the file or
    quoting the `--gin_param` text that failed, and exits with status 2, before anything is built
    or compiled; so does a binding of a renamed `train` parameter, naming its new name
    (`check_renamed_bindings`). Each file and each binding is parsed on its own so the error names
    its source.

    Args:
      gin_files: paths of gin files, parsed in order.
      gin_params: gin bindings such as `"train.num_steps = 10"`, parsed after the files.

    Raises:
      SystemExit: a file does not exist (status 1), gin cannot parse the config or it binds a renamed
        parameter (status 2).
    """
    for f in gin_files:
        if not os.path.exists(f):
            raise SystemExit(f"error: gin file {f!r} does not exist")
    texts = [(f"gin file {f}", open(f, encoding="utf-8").read()) for f in gin_files]
    refused = []
    for source, text in texts + [(f"--gin_param {p!r}", p) for p in gin_params]:
        try:
            check_renamed_bindings(text, source)
        except ValueError as e:
            refused.append(str(e))
    if refused:
        print("error: " + "\nerror: ".join(refused), file=sys.stderr)
        raise SystemExit(2)
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


"""Meta-trained optimizers shipped with lopt, as package data with their provenance.

    import lopt.pretrained
    lopt.pretrained.names()                          # the shipped names
    tx = lopt.pretrained.load(NAME, num_steps=1000)  # an optax transform
    lopt.pretrained.info(NAME)["command"]            # how to meta-train it again

Each shipped optimizer NAME is two files in this package: NAME.msgpack, its theta as
`lopt.save_theta` writes it (architecture, config and theta), and NAME.json, its provenance:
the gin config it was meta-trained from, the command that re-creates it, the git commit, the
meta-training steps, hours and hardware, what it was measured to do on held-out tasks against
tuned Adam (including where it loses), the licence and the SHA-256 of the theta file, which
`load` checks, and optionally the range of meta-training horizons ("meta_training_horizons", [min,
max] steps; `load` warns past max). This version ships "normmlp_v3", the best, and "normmlp_v2"
(docs/pretrained.md has their measurements and where they lose).
"""
from __future__ import annotations

import copy
import hashlib
import json
import numbers
import os
import warnings
from typing import Any, Optional

import optax

from lopt.base import LearnedOptimizer
from lopt.serialization import load_learned_optimizer

__all__ = ["names", "load", "info", "load_learned_optimizer_by_name", "theta_path"]

_DIR = os.path.dirname(os.path.abspath(__file__))
# What every provenance file records (checked by `info`, so a shipped file cannot lack any of them).
REQUIRED_INFO = ("name", "architecture", "gin_config", "command", "git_commit", "meta_training_steps",
                 "meta_training_hours", "hardware", "suite_summary", "licence", "theta_sha256")


def names() -> list[str]:
    """The names of the shipped meta-trained optimizers, sorted.

    Returns:
      Every NAME with both NAME.msgpack and NAME.json in this package.
    """
    files = set(os.listdir(_DIR))
    return sorted(f[:-len(".json")] for f in files if f.endswith(".json") and f[:-len(".json")] + ".msgpack" in files)


def _check_name(name: str) -> None:
    if not isinstance(name, str) or name not in names():
        known = ", ".join(repr(n) for n in names()) or "none"
        raise ValueError(f"unknown pretrained optimizer {name!r}; known: {known}")


def theta_path(name: str) -> str:
    """The path of the shipped theta file of `name` (a `lopt.save_theta` file).

    Args:
      name: one of `names()`.

    Returns:
      The absolute path of NAME.msgpack.

    Raises:
      ValueError: `name` is not shipped (the message lists the known names).
    """
    _check_name(name)
    return os.path.join(_DIR, name + ".msgpack")


def info(name: str) -> dict:
    """The provenance of a shipped optimizer.

    Args:
      name: one of `names()`.

    Returns:
      A fresh dict with at least the keys of `REQUIRED_INFO`: "gin_config" (the config text it was
      meta-trained from), "command" (the one command that re-creates it), "git_commit",
      "meta_training_steps", "meta_training_hours", "hardware", "suite_summary" (its measured
      results against tuned Adam on held-out tasks, where it loses included), "licence",
      "theta_sha256"; and the "architecture" with its "config".

    Raises:
      ValueError: `name` is not shipped, or its provenance file lacks a required entry.
    """
    _check_name(name)
    with open(os.path.join(_DIR, name + ".json"), encoding="utf-8") as f:
        record = json.load(f)
    missing = [k for k in REQUIRED_INFO if k not in record]
    if missing:
        raise ValueError(f"the provenance file of pretrained optimizer {name!r} lacks {missing}")
    return copy.deepcopy(record)


def load_learned_optimizer_by_name(name: str) -> tuple[LearnedOptimizer, Any]:
    """The shipped optimizer's architecture and theta, its file checked against the recorded SHA-256.

    Args:
      name: one of `names()`.

    Returns:
      (the LearnedOptimizer built from the saved config, theta as jax arrays).

    Raises:
      ValueError: `name` is not shipped, or its theta file does not have the recorded checksum or
        architecture (a damaged or replaced file).
    """
    return _load(name)[1:]


def _load(name: str) -> tuple[dict, LearnedOptimizer, Any]:
    """(provenance, architecture, theta) of a shipped optimizer, the theta file checked (see above)."""
    record = info(name)
    path = theta_path(name)
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    if digest != record["theta_sha256"]:
        raise ValueError(f"the theta file of pretrained optimizer {name!r} ({path}) has SHA-256 {digest}, but "
                         f"{record['theta_sha256']} is recorded: the file is damaged or was replaced; reinstall lopt")
    learned_opt, theta = load_learned_optimizer(path)
    if learned_opt.name != record["architecture"]:
        raise ValueError(f"pretrained optimizer {name!r}: its theta file holds {learned_opt.name}, but its provenance "
                         f"records {record['architecture']}")
    return record, learned_opt, theta


def load(name: str, num_steps: Optional[int] = None) -> optax.GradientTransformationExtraArgs:
    """A shipped meta-trained optimizer as an optax transform.

    Use it as any optax optimizer; it reads the params, so pass them (and, optionally, the loss):
    `updates, state = tx.update(grads, state, params, loss=loss)`.

    Args:
      name: one of `names()`.
      num_steps: the training horizon (the number of updates you will make). Required by
        optimizers meta-trained with progress features (their learned step-size schedule depends
        on the fraction of training done); others ignore it.

    Returns:
      An `optax.GradientTransformationExtraArgs`.

    Raises:
      ValueError: `name` is not shipped, its files are damaged, or `num_steps` is missing or not a
        positive integer where the optimizer needs it.

    Warns (UserWarning) when `num_steps` exceeds the longest meta-training horizon the provenance
    records ("meta_training_horizons").
    """
    record, learned_opt, theta = _load(name)
    needs_horizon = bool(getattr(learned_opt, "use_num_steps", False))
    if num_steps is None and needs_horizon:
        raise ValueError(f"pretrained optimizer {name!r} schedules its step size by training progress: pass "
                         f"num_steps=<the number of updates you will make>, e.g. "
                         f"lopt.pretrained.load({name!r}, num_steps=1000)")
    if num_steps is not None and (isinstance(num_steps, bool) or not isinstance(num_steps, numbers.Integral) or num_steps < 1):
        raise ValueError(f"num_steps must be a positive int (the training horizon), got {num_steps!r}")
    horizons = record.get("meta_training_horizons")
    if num_steps is not None and horizons and num_steps > horizons[1]:
        warnings.warn(f"pretrained optimizer {name!r} was meta-trained on horizons of {horizons[0]}-{horizons[1]} steps; "
                      f"at num_steps={num_steps} it is outside them (docs/pretrained.md measures it at 4x: finite, but "
                      f"often ending at a higher loss than with a shorter horizon)", stacklevel=2)
    return learned_opt.opt_fn(theta, num_steps=num_steps)

"""Learned optimizers released by other authors, run in lopt's own code from their released weights.

    import lopt.published
    lopt.published.names()                              # ["celo", "celo_adam"]
    tx = lopt.published.load("celo_adam", num_steps=N)  # an optax transform
    updates, state = tx.update(grads, state, params, loss=loss)
    lopt.published.info("celo")["source_repository"]    # where the weights come from, their licence

Each NAME is a folder of this package holding the authors' theta file as they released it
(theta.state, checked against the SHA-256 recorded in info.json), their LICENSE, and info.json:
the architecture that runs it (`lopt.archs`), the source repository, commit and file, the paper,
the licence and copyright holder, how it was meta-trained, and how lopt's update was checked
against the authors' own code. The architectures are written from the paper and the authors'
code (`lopt.archs.celo`, `lopt.archs.celo_adam`); `authors_theta` maps the file's entries to their theta.

- "celo": Celo (Moudgil et al. 2025), MIT licence: a per-parameter MLP scaled by a learned LSTM scheduler.
- "celo_adam": Celo-Adam, MIT licence: Adam whose learning rate that scheduler sets.

Both read the training loss and need the horizon N (they schedule by t/N and the loss history).
"""
from __future__ import annotations

import copy
import hashlib
import json
import numbers
import os
from typing import Any

import optax

from lopt.archs.celo import Celo
from lopt.archs.celo_adam import CeloAdam
from lopt.base import LearnedOptimizer
from lopt.published import authors_theta

__all__ = ["names", "info", "load", "learned_optimizer", "theta_path", "licence_path"]

_DIR = os.path.dirname(os.path.abspath(__file__))
THETA_FILE = "theta.state"
LICENCE_FILE = "LICENSE"
INFO_FILE = "info.json"
_ARCHITECTURES = {"Celo": Celo, "CeloAdam": CeloAdam}
REQUIRED_INFO = ("name", "architecture", "config", "source_repository", "source_commit", "source_file", "paper",
                 "licence", "copyright", "theta_sha256")


def names() -> list[str]:
    """The names of the published optimizers lopt runs, sorted.

    Returns:
      Every NAME with a folder holding theta.state, LICENSE and info.json.
    """
    found = []
    for entry in os.listdir(_DIR):
        folder = os.path.join(_DIR, entry)
        if all(os.path.isfile(os.path.join(folder, f)) for f in (THETA_FILE, LICENCE_FILE, INFO_FILE)):
            found.append(entry)
    return sorted(found)


def _check_name(name: str) -> None:
    if not isinstance(name, str) or name not in names():
        raise ValueError(f"unknown published optimizer {name!r}; known: {', '.join(map(repr, names())) or 'none'}")


def theta_path(name: str) -> str:
    """The path of the authors' theta file of `name`, as they released it.

    Args:
      name: one of `names()`.

    Returns:
      The absolute path of NAME/theta.state.
    """
    _check_name(name)
    return os.path.join(_DIR, name, THETA_FILE)


def licence_path(name: str) -> str:
    """The path of the licence the authors released `name` under (their repository's LICENSE).

    Args:
      name: one of `names()`.

    Returns:
      The absolute path of NAME/LICENSE.
    """
    _check_name(name)
    return os.path.join(_DIR, name, LICENCE_FILE)


def info(name: str) -> dict:
    """The provenance of a published optimizer.

    Args:
      name: one of `names()`.

    Returns:
      A fresh dict with at least the keys of `REQUIRED_INFO`: "architecture" (a `lopt.archs` class
      name) and its "config", "source_repository", "source_commit", "source_file" (the theta file
      in that repository), "paper", "licence" (e.g. "MIT"), "copyright", "theta_sha256"; and
      "licence_path", the licence text shipped beside the weights.

    Raises:
      ValueError: `name` is unknown, or its info.json lacks a required entry.
    """
    _check_name(name)
    with open(os.path.join(_DIR, name, INFO_FILE), encoding="utf-8") as f:
        record = json.load(f)
    missing = [k for k in REQUIRED_INFO if k not in record]
    if missing:
        raise ValueError(f"the info.json of published optimizer {name!r} lacks {missing}")
    record = copy.deepcopy(record)
    record["licence_path"] = licence_path(name)
    return record


def learned_optimizer(name: str) -> tuple[LearnedOptimizer, Any]:
    """The architecture and theta of a published optimizer, its file checked against the recorded SHA-256.

    Args:
      name: one of `names()`.

    Returns:
      (the LearnedOptimizer, theta as jax arrays in its layout).

    Raises:
      ValueError: `name` is unknown, or its theta file is damaged or does not fit the architecture.
    """
    record = info(name)
    path = theta_path(name)
    with open(path, "rb") as f:
        data = f.read()
    digest = hashlib.sha256(data).hexdigest()
    if digest != record["theta_sha256"]:
        raise ValueError(f"the theta file of published optimizer {name!r} ({path}) has SHA-256 {digest}, but "
                         f"{record['theta_sha256']} is recorded: the file is damaged or was replaced; reinstall lopt")
    if record["architecture"] not in _ARCHITECTURES:
        raise ValueError(f"published optimizer {name!r}: unknown architecture {record['architecture']!r}")
    learned_opt = _ARCHITECTURES[record["architecture"]](**record["config"])
    try:
        theta = authors_theta.CONVERTERS[record["architecture"]](authors_theta.read(data))
    except (KeyError, IndexError, ValueError) as e:
        raise ValueError(f"published optimizer {name!r}: {path} does not hold a {record['architecture']} theta "
                         f"({type(e).__name__}: {e})") from None
    learned_opt.check_theta(theta, f"lopt.published.learned_optimizer({name!r})")
    return learned_opt, theta


def load(name: str, num_steps: int) -> optax.GradientTransformationExtraArgs:
    """A published optimizer as an optax transform, computing what the authors' code computes.

    Pass the params and the training loss: `updates, state = tx.update(grads, state, params, loss=loss)`.

    Args:
      name: one of `names()`.
      num_steps: the training horizon N, the number of updates you will make (the learned
        scheduler reads the progress t/N and sizes its loss averages by N).

    Returns:
      An `optax.GradientTransformationExtraArgs`.

    Raises:
      ValueError: `name` is unknown, its files are damaged, or `num_steps` is not a positive int.
    """
    if isinstance(num_steps, bool) or not isinstance(num_steps, numbers.Integral) or num_steps < 1:
        raise ValueError(f"lopt.published.load({name!r}): num_steps must be a positive int (the training horizon), "
                         f"got {num_steps!r}")
    learned_opt, theta = learned_optimizer(name)
    return learned_opt.opt_fn(theta, num_steps=int(num_steps))

"""Saving and loading meta-trained theta: msgpack (flax.serialization) + the architecture's config.

File layout (one msgpack map, never pickle):
    {"format": "lopt.theta", "version": 1, "architecture": "MLPLOpt",
     "config": "<JSON of learned_opt.config()>", "theta": <theta as a state dict>}
Writes are atomic (`lopt.file_io.atomic_write_bytes`), so a crash never leaves half a file.
"""
from __future__ import annotations

import json
import os
from typing import Any, Optional

import jax
import numpy as np
import optax
from flax import serialization

from lopt.parts import features as ft
from lopt.base import LearnedOptimizer, architecture, architectures
from lopt.file_io import atomic_write_bytes, read_msgpack_file
from lopt.parts import tree_checks

FORMAT, VERSION = "lopt.theta", 1


def save_theta(path: str, learned_opt: LearnedOptimizer, theta: Any) -> None:
    """Saves theta with the architecture name and `config()` of `learned_opt`, atomically.

    Args:
      path: the file to write (replaced if it exists).
      learned_opt: the LearnedOptimizer theta belongs to.
      theta: its meta-parameters (checked against `learned_opt.theta_spec()`).

    Raises:
      TypeError: `learned_opt` is not a LearnedOptimizer.
      ValueError: theta does not have `learned_opt`'s structure and leaf shapes.
    """
    if not isinstance(learned_opt, LearnedOptimizer):
        raise TypeError(f"save_theta needs a LearnedOptimizer, got {type(learned_opt).__name__}")
    learned_opt.check_theta(theta, "save_theta")
    payload = {
        "format": FORMAT, "version": VERSION, "architecture": type(learned_opt).__name__,
        "config": json.dumps(learned_opt.config(), sort_keys=True),
        "theta": serialization.to_state_dict(jax.tree_util.tree_map(np.asarray, jax.device_get(theta))),
    }
    atomic_write_bytes(path, serialization.msgpack_serialize(payload))


def _invalid(path: str, what: str) -> ValueError:
    return ValueError(f"{path} is not a valid lopt theta file: {what}")


def _read(path: str, need_architecture: bool = True) -> tuple[Optional[LearnedOptimizer], Any]:
    """(the saved architecture built from its config, theta as numpy arrays), each entry checked.

    Without `need_architecture`, an architecture that is not registered (its module not imported)
    gives (None, theta), theta unchecked against it."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"no saved theta at {path}")
    payload = read_msgpack_file(path, FORMAT, "lopt theta file")
    if "version" not in payload:
        raise _invalid(path, 'missing entry "version"')
    if payload["version"] != VERSION:
        raise _invalid(path, f"unknown version {payload['version']!r} (this lopt reads {VERSION})")
    arch_name = payload.get("architecture")
    if not isinstance(arch_name, str):
        raise _invalid(path, f'missing or malformed entry "architecture" (a class name), got {arch_name!r}')
    try:
        config = json.loads(payload["config"])
        if not isinstance(config, dict):
            raise TypeError(f"a JSON {type(config).__name__}, not an object")
    except (KeyError, TypeError, ValueError) as e:
        raise _invalid(path, f'missing or malformed entry "config" (the JSON of the constructor arguments): '
                             f'{type(e).__name__}: {e}') from None
    theta = payload.get("theta")
    if not isinstance(theta, dict) or not jax.tree_util.tree_leaves(theta):
        raise _invalid(path, f'missing or malformed entry "theta" (a dict of arrays), got {type(theta).__name__}')
    for key_path, leaf in jax.tree_util.tree_flatten_with_path(theta)[0]:
        where = f'leaf {tree_checks.leaf_path(key_path)} of entry "theta"'
        if not np.issubdtype(np.asarray(leaf).dtype, np.number):
            raise _invalid(path, f"{where} is not a numeric array (got {type(leaf).__name__} {leaf!r:.40})")
        if not np.all(np.isfinite(leaf)):
            raise _invalid(path, f"non-finite values in {where}")
    if arch_name not in architectures():
        if not need_architecture:
            return None, theta
        raise _invalid(path, f"unknown architecture {arch_name!r}; registered: {architectures()} (import the "
                             f"module that defines it before loading)")
    try:
        learned_opt = architecture(arch_name)(**config)
    except (TypeError, ValueError) as e:
        raise _invalid(path, f'entry "config" does not build {arch_name}: {type(e).__name__}: {e}') from None
    spec = learned_opt.theta_spec()
    mismatch = tree_checks.tree_mismatch(theta, serialization.to_state_dict(spec), f"{learned_opt!r}'s theta")
    if mismatch is not None:
        raise _invalid(path, f'entry "theta" does not match its architecture and config: {mismatch}')
    return learned_opt, serialization.from_state_dict(spec, theta)


def load_theta(path: str, learned_opt: Optional[LearnedOptimizer] = None) -> Any:
    """Loads theta, checked: a file that is not a valid theta file (unknown version, malformed or
    missing entries, non-finite values) is refused with an error naming the file and what is wrong.

    Args:
      path: the theta file (`save_theta`).
      learned_opt: if given, a file of another architecture or config is refused, listing what differs.

    Returns:
      theta, a pytree of jax arrays.
    """
    saved, theta = _read(path, need_architecture=learned_opt is not None)
    if learned_opt is not None and (saved.name, saved.config()) != (learned_opt.name, learned_opt.config()):
        a, b = (saved.name, saved.config()), (learned_opt.name, learned_opt.config())
        raise ValueError(
            f"{path} holds theta of {a[0]}({_fmt(a[1])}) but it is being loaded into {b[0]}({_fmt(b[1])}); "
            f"differs in: {_diff(a, b)}. Build the same architecture and config to load it, or use "
            f"load_learned_optimizer({path!r})")
    return jax.tree_util.tree_map(jax.numpy.asarray, theta)


def load_learned_optimizer(path: str) -> tuple[LearnedOptimizer, Any]:
    """Rebuilds the saved architecture from its config and returns (learned_opt, theta).

    Args:
      path: the theta file (`save_theta`); checked as by `load_theta`.

    Returns:
      (the LearnedOptimizer, theta as jax arrays).
    """
    learned_opt, theta = _read(path)
    return learned_opt, jax.tree_util.tree_map(jax.numpy.asarray, theta)


def load_optimizer(path: str, *, num_steps: Optional[int] = None) -> optax.GradientTransformationExtraArgs:
    """The saved learned optimizer as a ready optax transform.

    Args:
      path: the theta file (`save_theta`); checked as by `load_theta`.
      num_steps: the training horizon for the optimizer's progress features (None: unknown).

    Returns:
      `learned_opt.opt_fn(theta, num_steps=num_steps)` of the saved architecture and theta.
    """
    learned_opt, theta = load_learned_optimizer(path)
    return learned_opt.opt_fn(theta, num_steps=num_steps)


def _fmt(config: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in sorted(config.items()))


def _diff(saved: tuple[str, dict], mine: tuple[str, dict]) -> str:
    """'architecture (saved A, here B); hidden_size (saved 32, here 16); ...'"""
    parts = [] if saved[0] == mine[0] else [f"architecture (saved {saved[0]}, here {mine[0]})"]
    missing = object()
    for k in sorted(set(saved[1]) | set(mine[1])):
        a, b = saved[1].get(k, missing), mine[1].get(k, missing)
        if a != b:
            show = lambda x: "<absent>" if x is missing else repr(x)
            parts.append(f"{k} (saved {show(a)}, here {show(b)})")
    return "; ".join(parts)

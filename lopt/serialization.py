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

from lopt.base import LearnedOptimizer, architecture
from lopt.file_io import atomic_write_bytes, read_msgpack_file

FORMAT, VERSION = "lopt.theta", 1


def save_theta(path: str, learned_opt: LearnedOptimizer, theta: Any) -> None:
    """Saves theta with the architecture name and config of `learned_opt`."""
    if not isinstance(learned_opt, LearnedOptimizer):
        raise TypeError(f"save_theta needs a LearnedOptimizer, got {type(learned_opt).__name__}")
    _check_structure(learned_opt, theta, "save_theta")
    payload = {
        "format": FORMAT, "version": VERSION, "architecture": type(learned_opt).__name__,
        "config": json.dumps(learned_opt.config(), sort_keys=True),
        "theta": serialization.to_state_dict(jax.tree_util.tree_map(np.asarray, jax.device_get(theta))),
    }
    atomic_write_bytes(path, serialization.msgpack_serialize(payload))


def _read(path: str) -> dict:
    if not os.path.exists(path):
        raise FileNotFoundError(f"no saved theta at {path}")
    return read_msgpack_file(path, FORMAT, "lopt theta file")


def _check_structure(learned_opt: LearnedOptimizer, theta: Any, where: str) -> None:
    want = jax.eval_shape(learned_opt.init, jax.random.key(0))
    got_struct, want_struct = jax.tree_util.tree_structure(theta), jax.tree_util.tree_structure(want)
    if got_struct != want_struct:
        raise ValueError(f"{where}: theta's structure does not match {learned_opt!r}: {got_struct} vs {want_struct}")
    for g, w in zip(jax.tree_util.tree_leaves(theta), jax.tree_util.tree_leaves(want)):
        if tuple(np.shape(g)) != tuple(w.shape):
            raise ValueError(f"{where}: theta leaf of shape {np.shape(g)} where {learned_opt!r} has {w.shape}")


def load_theta(path: str, learned_opt: Optional[LearnedOptimizer] = None) -> Any:
    """Loads theta. With `learned_opt`, refuses a file of another architecture/config."""
    payload = _read(path)
    if learned_opt is not None:
        saved = (payload["architecture"], _normalized_config(payload["architecture"], json.loads(payload["config"])))
        mine = (type(learned_opt).__name__, learned_opt.config())
        if saved != mine:
            raise ValueError(
                f"{path} holds theta of {saved[0]}({_fmt(saved[1])}) but it is being loaded into "
                f"{mine[0]}({_fmt(mine[1])}); differs in: {_diff(saved, mine)}. Build the same "
                f"architecture and config to load it, or use load_learned_optimizer({path!r})")
        target = jax.eval_shape(learned_opt.init, jax.random.key(0))
        theta = serialization.from_state_dict(target, payload["theta"])
        _check_structure(learned_opt, theta, f"load_theta({path})")
        return jax.tree_util.tree_map(jax.numpy.asarray, theta)
    return jax.tree_util.tree_map(jax.numpy.asarray, payload["theta"])


def load_learned_optimizer(path: str) -> tuple[LearnedOptimizer, Any]:
    """Rebuilds the saved architecture from its config and returns (learned_opt, theta)."""
    payload = _read(path)
    learned_opt = architecture(payload["architecture"])(**json.loads(payload["config"]))
    return learned_opt, load_theta(path, learned_opt)


def load_optimizer(path: str, *, num_steps: Optional[int] = None) -> optax.GradientTransformationExtraArgs:
    """The saved learned optimizer as a ready optax transform."""
    learned_opt, theta = load_learned_optimizer(path)
    return learned_opt.opt_fn(theta, num_steps=num_steps)


def _normalized_config(arch_name: str, config: dict) -> dict:
    """The saved config as the architecture rebuilds it today: options added since the file was
    written take their defaults, so they don't count as differences."""
    try:
        return architecture(arch_name)(**config).config()
    except (ValueError, TypeError):
        return config


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

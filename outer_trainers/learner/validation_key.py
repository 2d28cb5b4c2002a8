"""The validation baseline's cache key: what a task or family contributes to it, and where two keys differ.

    key = {"tasks": [{"family": describe(family), ...}], ...}     # `ValidationSelector.cache_key`
    key_differences(old_key, new_key)                            # ["lrs", "tasks[0].num_steps"]
    digest(key)                                                  # its SHA-256, as a theta_best record stores it

A key holds everything that determines the tuned baseline's results, so that a cache (or a
theta_best record) made under another key is recomputed (or refused), never reused.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any

import jax
import numpy as np


def _plain(value: Any, depth: int) -> Any:
    """A JSON-able description of an attribute value, or None for what cannot be described."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple)):
        items = [_plain(v, depth) for v in value]
        return items if all(i is not None or v is None for i, v in zip(items, value)) else None
    if depth < 2 and hasattr(value, "__dict__") and not callable(value) and not isinstance(value, jax.Array):
        return describe(value, depth + 1)
    return None


def describe(obj: Any, depth: int = 0) -> dict:
    """A task or family's part of the cache key: its class, its plain public attributes, its data's digest.

    Attributes holding numbers, strings, tuples of them or (two levels deep) objects such as a
    lifted Task are described; arrays and functions are not (their effect on the data is in the digest).

    Args:
      obj: a TaskFamily or Task.
      depth: the nesting level (for objects held by `obj`).

    Returns:
      {"class": ..., attribute: value, ..., "data": {"name", "batch_size", "sha256"}} (data only when it has some).
    """
    out = {"class": type(obj).__name__}
    for k, v in sorted(vars(obj).items()):
        if k.startswith("_") or k == "data":
            continue
        plain = _plain(v, depth)
        if plain is not None or v is None:
            out[k] = plain
    data = getattr(obj, "data", None)
    if data is not None:
        h = hashlib.sha256()
        for path, leaf in jax.tree_util.tree_leaves_with_path(getattr(data, "splits", {})):
            arr = np.asarray(jax.device_get(leaf))
            h.update(f"{jax.tree_util.keystr(path)}{arr.shape}{arr.dtype}".encode())
            h.update(np.ascontiguousarray(arr).tobytes())
        out["data"] = {"name": getattr(data, "name", None), "batch_size": getattr(data, "batch_size", None),
                       "sha256": h.hexdigest()}
    return out


def key_differences(a: Any, b: Any, at: str = "") -> list[str]:
    """Where two cache keys (JSON values) differ, e.g. ["lrs", "tasks[0].num_steps"].

    Args:
      a: one key (or part of one).
      b: the other.
      at: the path of this part (for the recursion).

    Returns:
      the paths of the differing entries (a list of different length, or a changed leaf, is one entry).
    """
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b))
                for d in key_differences(a.get(k), b.get(k), f"{at}.{k}" if at else k)]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b) and any(isinstance(x, dict) for x in a):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in key_differences(x, y, f"{at}[{i}]")]
    return [] if a == b else [at or "(the whole key)"]


def digest(doc: Any) -> str:
    """The SHA-256 of a JSON value (sorted keys), as hex: what a theta_best record stores of a cache key."""
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode("utf-8")).hexdigest()

"""One checkpoint file: a pytree state as checksummed msgpack bytes, read back and restored into a template.

    data = to_bytes(state, step, meta={...})          # what CheckpointManager writes atomically
    payload = read(path)                             # decoded and verified (checksum first)
    state, payload = restore(path, template, expect={...})

A file is one msgpack map `{"format", "version", "step", "meta", "structure", "leaves",
"key_leaves", "checksum"}`, never pickle: "meta" is the caller's metadata as JSON; "structure" is
JSON `[[path, shape, dtype], ...]` of every leaf (`structure_of`), which a restore compares with
its template; "leaves" maps the zero-padded flatten index of each leaf to its array;
"key_leaves" maps the index of each typed PRNG key leaf to its key implementation (the key is
stored as `jax.random.key_data` and rewrapped on restore); "checksum" is the SHA-256 of all of it
(`checksum`), verified on every read before anything else, so a flipped bit is reported as
corruption (`CorruptCheckpointError`), never loaded and never mistaken for a checkpoint of
another run. Version-1 files (no checksum) are still read, with a warning.
"""
from __future__ import annotations

import hashlib
import json
import warnings
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization

from lopt.file_io import read_msgpack_file

FORMAT, VERSION = "lopt.checkpoint", 2


class CorruptCheckpointError(ValueError):
    """A file under a checkpoint name that does not decode or fails its checksum (skipped, then set aside)."""


def _is_key(x: Any) -> bool:
    return hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def structure_of(tree: Any) -> list[list]:
    """What a checkpoint's state must match to be restored into a template.

    Args:
        tree: a pytree of arrays, jax.ShapeDtypeStructs or other leaves.

    Returns:
        [[path, shape, dtype], ...] for every leaf in flatten order (path as `jax.tree_util.keystr`,
        dtype as a string; the type name for leaves without a dtype).
    """
    out = []
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        dtype = str(leaf.dtype) if hasattr(leaf, "dtype") else type(leaf).__name__
        out.append([jax.tree_util.keystr(path), list(np.shape(leaf)), dtype])
    return out


def to_bytes(state: Any, step: int, meta: Optional[dict] = None) -> bytes:
    """A checkpoint file's bytes (see the module docstring for the layout).

    Args:
        state: any pytree of arrays, typed PRNG keys included.
        step: the step the checkpoint is taken at.
        meta: JSON-able metadata stored with it (None: {}).

    Returns:
        The msgpack bytes.
    """
    leaves = jax.device_get(jax.tree_util.tree_leaves(state))
    stored, key_leaves = {}, {}
    for i, leaf in enumerate(leaves):
        if _is_key(leaf):
            key_leaves[str(i)] = str(jax.random.key_impl(leaf))
            leaf = jax.random.key_data(leaf)
        stored[f"{i:06d}"] = np.asarray(leaf)
    payload = {"format": FORMAT, "version": VERSION, "step": int(step), "meta": json.dumps(meta or {}),
               "structure": json.dumps(structure_of(state)), "leaves": stored, "key_leaves": key_leaves}
    payload["checksum"] = checksum(payload)
    return serialization.msgpack_serialize(payload)


def checksum(payload: dict) -> str:
    """The SHA-256 of a checkpoint's content, as stored in (and verified against) its "checksum" entry.

    Args:
        payload: a checkpoint's map as `to_bytes` builds it or msgpack decodes it ("meta" and
            "structure" still JSON text).

    Returns:
        The hex digest over the format, version, step, meta, structure and key-leaf entries and, in
        name order, every leaf's name, dtype, shape and bytes.
    """
    head = [payload["format"], int(payload["version"]), int(payload["step"]), payload["meta"], payload["structure"],
            sorted(payload["key_leaves"].items())]
    h = hashlib.sha256(json.dumps(head).encode("utf-8"))
    for name in sorted(payload["leaves"]):
        leaf = np.asarray(payload["leaves"][name])
        h.update(json.dumps([name, str(leaf.dtype), list(leaf.shape)]).encode("utf-8"))
        h.update(leaf.tobytes())
    return h.hexdigest()


def read(path: str) -> dict:
    """The decoded checkpoint file at `path`, verified, with "meta" and "structure" parsed from JSON.

    The checksum is verified before anything in the file is interpreted; a version-1 file (which
    has none) is read with a warning that its integrity cannot be verified.

    Args:
        path: the checkpoint file.

    Returns:
        The decoded map.

    Raises:
        CorruptCheckpointError: (a ValueError) the file does not decode, fails its checksum, or is not
            a lopt checkpoint of a version this code reads.
        OSError: the file cannot be opened.
    """
    payload = read_msgpack_file(path, FORMAT, "lopt checkpoint", CorruptCheckpointError)
    try:
        version = payload.get("version")
        if version == VERSION:
            stored, actual = payload.get("checksum"), checksum(payload)
            if stored != actual:
                raise CorruptCheckpointError(f"{path} is corrupt: its content does not match its checksum "
                                             f"(stored {stored!r}, computed {actual!r})")
        elif version == 1:
            warnings.warn(f"checkpoint {path} has format version 1, which carries no checksum: "
                          f"its integrity cannot be verified")
        else:
            raise CorruptCheckpointError(f"{path} has checkpoint format version {version!r}, which this lopt does "
                                         f"not read (versions 1 and {VERSION}): it is corrupt or from a newer lopt")
        payload["step"] = int(payload["step"])
        payload["meta"] = json.loads(payload["meta"])
        payload["structure"] = json.loads(payload["structure"])
        if not isinstance(payload["leaves"], dict) or not isinstance(payload["key_leaves"], dict):
            raise TypeError("leaves and key_leaves must be maps")
    except CorruptCheckpointError:
        raise
    except Exception as e:  # a corrupt field of a version-1 file, or a checksum over malformed entries
        raise CorruptCheckpointError(f"{path} is not a readable lopt checkpoint ({type(e).__name__}: {e})") from e
    return payload


def _structure_diff(saved: list, want: list) -> str:
    if len(saved) != len(want):
        extra = {tuple(map(str, s)) for s in saved} ^ {tuple(map(str, w)) for w in want}
        return f"{len(saved)} leaves saved vs {len(want)} expected; e.g. {sorted(extra)[:3]}"
    for s, w in zip(saved, want):
        if s != w:
            return f"leaf {s[0]} saved with shape {s[1]} {s[2]}, expected {w[0]} with shape {w[1]} {w[2]}"
    return ""


def _describe(got: Any, want: Any) -> str:
    """What differs between a saved and an expected metadata value, in words."""
    if isinstance(got, dict) and isinstance(want, dict):
        keys = sorted(x for x in set(got) | set(want) if got.get(x) != want.get(x))
        return "; ".join(f"{x}: {_describe(got.get(x), want.get(x))}" for x in keys)
    if isinstance(got, list) and isinstance(want, list) and all(isinstance(x, str) for x in got + want):
        return (f"only in checkpoint: {[x for x in got if x not in want]}; "
                f"only here: {[x for x in want if x not in got]}")
    return f"saved {got!r}, here {want!r}"


def meta_differences(saved: dict, expect: dict) -> list[str]:
    """What differs between a checkpoint's metadata and what a run requires, one phrase per key.

    Args:
        saved: the checkpoint's metadata.
        expect: the metadata the run requires.

    Returns:
        "key (how it differs)" for every key of `expect` whose saved value differs, in `expect`'s order.
    """
    return [f"{k} ({_describe(saved.get(k), want)})" for k, want in expect.items() if saved.get(k) != want]


def check_meta(path: str, saved: dict, expect: dict) -> None:
    """Checks a checkpoint's metadata against what this run requires.

    Args:
        path: the checkpoint's path (for the message).
        saved: the checkpoint's metadata.
        expect: the metadata this run requires.

    Raises:
        ValueError: naming every key of `expect` whose saved value differs, and how.
    """
    diffs = meta_differences(saved, expect)
    if diffs:
        raise ValueError(f"checkpoint {path} does not match this run: " + " | ".join(diffs) +
                         ". Resume with the same learned optimizer and config, or use a new output_dir.")


def restore(path: str, template: Any, expect: Optional[dict] = None) -> tuple[Any, dict]:
    """The state stored at `path`, checked against what the caller expects.

    Args:
        path: a checkpoint file.
        template: a pytree (arrays or jax.ShapeDtypeStructs, e.g. from jax.eval_shape) with the expected
            structure; the restored leaves take its dtypes.
        expect: meta keys mapped to the values they must have (None: no check).

    Returns:
        (state, payload): the state in the template's structure, and the decoded file (`read`).

    Raises:
        CorruptCheckpointError: the file is unreadable or fails its checksum (see `read`).
        ValueError: its metadata or its state's structure differs from `expect` or `template` (named).
    """
    payload = read(path)
    return state_from_payload(payload, template, expect, path), payload


def state_from_payload(payload: dict, template: Any, expect: Optional[dict] = None, path: str = "checkpoint") -> Any:
    """The state held by a checkpoint already read (`read`), checked against what the caller expects.

    Args:
        payload: the decoded, verified checkpoint (`read(path)`).
        template: the expected structure (see `restore`).
        expect: meta keys mapped to the values they must have (None: no check).
        path: the checkpoint's path, for messages.

    Returns:
        The state in the template's structure.

    Raises:
        ValueError: its metadata or its state's structure differs from `expect` or `template` (named).
    """
    if expect:
        check_meta(path, payload["meta"], expect)
    want = structure_of(template)
    diff = _structure_diff(payload["structure"], want)
    if diff:
        raise ValueError(f"checkpoint {path} holds a state of another structure ({diff}); it was written "
                         f"by a different learned optimizer, estimator or task configuration")
    t_leaves, treedef = jax.tree_util.tree_flatten(template)
    leaves = []
    for i, t in enumerate(t_leaves):
        arr = payload["leaves"].get(f"{i:06d}")
        if arr is None:
            raise CorruptCheckpointError(f"{path} lists leaf {i} in its structure but does not hold it")
        if str(i) in payload["key_leaves"]:
            leaves.append(jax.random.wrap_key_data(jnp.asarray(arr), impl=payload["key_leaves"][str(i)]))
        else:
            leaves.append(jnp.asarray(arr, dtype=t.dtype))
    return jax.tree_util.tree_unflatten(treedef, leaves)

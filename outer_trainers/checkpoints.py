"""Checkpoints of a pytree state: one msgpack file per checkpoint, written atomically, never pickle.

    policy = CheckpointPolicy(every_steps=100, every_seconds=600, keep=3, checkpoints_at=(1000,),
                              best_metric="eval/final_loss", best_mode="min")
    mgr = CheckpointManager(directory, policy)
    mgr.save(step, state, meta={...}, kinds=mgr.due(step, now))   # rolling and/or permanent
    mgr.save_best(step, state, value, meta={...})                  # keeps the `keep_best` best
    found = mgr.latest()                                           # newest complete one, or None
    state, info = restore(found, template, expect={...})

Layout under `directory`: `ckpt_<step>.msgpack` (rolling, the last `keep` kept),
`permanent/ckpt_<step>.msgpack`, `best/ckpt_<step>.msgpack`. A file is one msgpack map
`{"format", "version", "step", "meta", "paths", "leaves", "key_leaves"}` with the state's leaves in
flatten order (typed PRNG keys stored as `jax.random.key_data` and rewrapped on restore). Files
are written to a temp file, fsynced and atomically renamed, so a file under its final name is
complete: a half-written checkpoint is a `.tmp-*` file that is never listed. A final-named file
that fails to decode is skipped with a warning and the next-newest is used.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import warnings
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization

from lopt.file_io import atomic_write_bytes, read_msgpack_file

FORMAT, VERSION = "lopt.checkpoint", 1
_NAME = re.compile(r"^ckpt_(\d+)\.msgpack$")
KINDS = ("rolling", "permanent", "best")


class CorruptCheckpointError(ValueError):
    """A file under a checkpoint name that does not decode (skipped when looking for the latest)."""


@dataclasses.dataclass(frozen=True)
class CheckpointPolicy:
    """When to save. Rolling: every `every_steps` steps and/or every `every_seconds` seconds,
    keeping the last `keep`. Permanent (never deleted): at `checkpoints_at` steps and every
    `permanent_every` steps. Best: when `best_metric` (a logged metric name) improves
    (`best_mode` "min" or "max"), keeping the `keep_best` best. `save_final`: a rolling
    checkpoint at the last step, so re-running a finished run does nothing."""

    every_steps: Optional[int] = None
    every_seconds: Optional[float] = 600.0
    keep: int = 3
    checkpoints_at: Sequence[int] = ()
    permanent_every: Optional[int] = None
    best_metric: Optional[str] = None
    best_mode: str = "min"
    keep_best: int = 1
    save_final: bool = True

    def __post_init__(self):
        if self.keep < 1 or self.keep_best < 1:
            raise ValueError(f"keep and keep_best must be >= 1, got {self.keep}, {self.keep_best}")
        if self.best_mode not in ("min", "max"):
            raise ValueError(f"best_mode must be 'min' or 'max', got {self.best_mode!r}")
        for name in ("every_steps", "permanent_every"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise ValueError(f"{name} must be >= 1 or None, got {v}")
        object.__setattr__(self, "checkpoints_at", tuple(int(s) for s in self.checkpoints_at))


# ---- state <-> bytes -------------------------------------------------------------------------------

def _is_key(x: Any) -> bool:
    return hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def structure_of(tree: Any) -> list[list]:
    """[[path, shape, dtype], ...] for every leaf: what a checkpoint must match to be restored."""
    out = []
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        dtype = str(leaf.dtype) if hasattr(leaf, "dtype") else type(leaf).__name__
        out.append([jax.tree_util.keystr(path), list(np.shape(leaf)), dtype])
    return out


def to_bytes(state: Any, step: int, meta: Optional[dict] = None) -> bytes:
    """Serialises `state` (any pytree of arrays, typed PRNG keys included) with JSON-able `meta`."""
    leaves = jax.device_get(jax.tree_util.tree_leaves(state))
    stored, key_leaves = {}, {}
    for i, leaf in enumerate(leaves):
        if _is_key(leaf):
            key_leaves[str(i)] = str(jax.random.key_impl(leaf))
            leaf = jax.random.key_data(leaf)
        stored[f"{i:06d}"] = np.asarray(leaf)
    payload = {"format": FORMAT, "version": VERSION, "step": int(step), "meta": json.dumps(meta or {}),
               "structure": json.dumps(structure_of(state)), "leaves": stored, "key_leaves": key_leaves}
    return serialization.msgpack_serialize(payload)


def read(path: str) -> dict:
    """The decoded checkpoint file (raises ValueError if it is not one)."""
    payload = read_msgpack_file(path, FORMAT, "lopt checkpoint", CorruptCheckpointError)
    payload["meta"] = json.loads(payload["meta"])
    payload["structure"] = json.loads(payload["structure"])
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


def check_meta(path: str, saved: dict, expect: dict) -> None:
    """Raises ValueError naming every key of `expect` whose saved value differs."""
    diffs = [f"{k} ({_describe(saved.get(k), want)})" for k, want in expect.items() if saved.get(k) != want]
    if diffs:
        raise ValueError(f"checkpoint {path} does not match this run: " + " | ".join(diffs) +
                         ". Resume with the same learned optimizer and config, or use a new output_dir.")


def restore(path: str, template: Any, expect: Optional[dict] = None) -> tuple[Any, dict]:
    """(state, payload) from `path`. `template` is a pytree (arrays or jax.ShapeDtypeStruct, e.g.
    from jax.eval_shape) with the expected structure; `expect` maps meta keys to required values.
    Mismatches raise ValueError naming what differs."""
    payload = read(path)
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
        arr = payload["leaves"][f"{i:06d}"]
        if str(i) in payload["key_leaves"]:
            leaves.append(jax.random.wrap_key_data(jnp.asarray(arr), impl=payload["key_leaves"][str(i)]))
        else:
            leaves.append(jnp.asarray(arr, dtype=t.dtype))
    return jax.tree_util.tree_unflatten(treedef, leaves), payload


# ---- files on disk ---------------------------------------------------------------------------------

class CheckpointManager:
    """Saves and finds checkpoints under `directory` according to `policy` (see module doc)."""

    def __init__(self, directory: str, policy: Optional[CheckpointPolicy] = None):
        self.directory = directory
        self.policy = policy or CheckpointPolicy()
        self._last_save_time: Optional[float] = None
        self.best_value: Optional[float] = None
        best = self.list("best")
        if best:  # recover the best metric value of a previous run of this directory
            values = [v for v in (self._best_value_of(p) for _, p in best) if v is not None]
            if values:
                self.best_value = min(values) if self.policy.best_mode == "min" else max(values)

    def _dir(self, kind: str) -> str:
        return self.directory if kind == "rolling" else os.path.join(self.directory, kind)

    def path(self, kind: str, step: int) -> str:
        return os.path.join(self._dir(kind), f"ckpt_{int(step):08d}.msgpack")

    def list(self, kind: str) -> list[tuple[int, str]]:
        """[(step, path)] of complete-named checkpoints of `kind`, oldest first."""
        d = self._dir(kind)
        if not os.path.isdir(d):
            return []
        found = [(int(m.group(1)), os.path.join(d, n)) for n in os.listdir(d) if (m := _NAME.match(n))]
        return sorted(found)

    def all(self) -> list[tuple[int, str]]:
        """Every checkpoint of every kind, newest step first."""
        return sorted((c for k in KINDS for c in self.list(k)), reverse=True)

    def latest(self) -> Optional[str]:
        """Path of the newest checkpoint that decodes, or None; unreadable ones are skipped."""
        for _, p in self.all():
            try:
                read(p)
                return p
            except (CorruptCheckpointError, OSError) as e:
                warnings.warn(f"skipping unreadable checkpoint: {e}")
        return None

    def restore_latest(self, template: Any, expect: Optional[dict] = None) -> Optional[tuple[Any, dict]]:
        """`restore` of the newest decodable checkpoint (None if there is none). A checkpoint that
        decodes but does not match `template`/`expect` raises: it is never silently skipped."""
        for _, p in self.all():
            try:
                return restore(p, template, expect)
            except (CorruptCheckpointError, OSError) as e:
                warnings.warn(f"skipping unreadable checkpoint: {e}")
        return None

    def mark_time(self, now: float) -> None:
        """Starts the every_seconds clock (call when training starts or resumes)."""
        self._last_save_time = now

    def due(self, step: int, now: float, *, final: bool = False) -> list[str]:
        """Which of "rolling"/"permanent" checkpoints the policy wants at `step` (time `now`)."""
        p, kinds = self.policy, []
        if p.checkpoints_at and step in p.checkpoints_at or (p.permanent_every and step % p.permanent_every == 0):
            kinds.append("permanent")
        by_steps = p.every_steps is not None and step % p.every_steps == 0
        by_time = (p.every_seconds is not None and self._last_save_time is not None
                   and now - self._last_save_time >= p.every_seconds)
        if by_steps or by_time or (final and p.save_final):
            kinds.append("rolling")
        return kinds

    def save(self, step: int, state: Any, meta: Optional[dict] = None, kinds: Sequence[str] = ("rolling",),
             now: Optional[float] = None) -> list[str]:
        """Writes the checkpoint once per kind in `kinds`; prunes rolling ones beyond `keep`."""
        paths = []
        if not kinds:
            return paths
        data = to_bytes(state, step, meta)
        for kind in kinds:
            path = self.path(kind, step)
            atomic_write_bytes(path, data)
            paths.append(path)
        if "rolling" in kinds:
            for _, old in self.list("rolling")[:-self.policy.keep]:
                _remove(old)
            if now is not None:
                self._last_save_time = now
        return paths

    def is_better(self, value: float) -> bool:
        if value is None or not np.isfinite(value):
            return False
        if self.best_value is None:
            return True
        return value < self.best_value if self.policy.best_mode == "min" else value > self.best_value

    def save_best(self, step: int, state: Any, value: float, meta: Optional[dict] = None) -> Optional[str]:
        """Saves a "best" checkpoint if `value` of `policy.best_metric` improves on the best so far;
        keeps the `keep_best` best. Returns the path written or None."""
        if not self.is_better(value):
            return None
        self.best_value = float(value)
        meta = dict(meta or {}, best_metric=self.policy.best_metric, best_value=float(value))
        path = self.path("best", step)
        atomic_write_bytes(path, to_bytes(state, step, meta))
        sign = 1.0 if self.policy.best_mode == "min" else -1.0

        def rank(c):  # best first; an unreadable file ranks last and is the first removed
            v = self._best_value_of(c[1])
            return float("inf") if v is None else sign * v

        ranked = sorted(self.list("best"), key=rank)
        for _, old in ranked[self.policy.keep_best:]:
            _remove(old)
        return path

    @staticmethod
    def _best_value_of(path: str) -> Optional[float]:
        try:
            return read(path)["meta"].get("best_value")
        except (CorruptCheckpointError, OSError):
            return None


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass

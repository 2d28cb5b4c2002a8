"""Checkpoints of a pytree state: one msgpack file per checkpoint, written atomically, never pickle.

    policy = CheckpointPolicy(every_steps=100, every_seconds=600, keep=3, checkpoints_at=(1000,),
                              best_metric="eval/final_loss", best_mode="min")
    mgr = CheckpointManager(directory, policy)
    mgr.save(step, state, meta={...}, kinds=mgr.due(step, now))   # rolling and/or permanent
    mgr.save_best(step, state, value, meta={...})                  # keeps the `keep_best` best
    found = mgr.latest()                                           # newest complete one, or None
    state, info = restore(found, template, expect={...})

Layout under `directory`: `ckpt_<step>.msgpack` (rolling, the last `keep` kept),
`permanent/ckpt_<step>.msgpack`, `best/ckpt_<step>.msgpack`, and `corrupt/`, where unreadable
files are moved aside (never deleted). A file is one msgpack map
`{"format", "version", "step", "meta", "structure", "leaves", "key_leaves", "checksum"}`: "meta"
is the caller's metadata as JSON; "structure" is JSON `[[path, shape, dtype], ...]` of every leaf
(`structure_of`), which a restore compares with its template; "leaves" maps the zero-padded
flatten index of each leaf to its array; "key_leaves" maps the index of each typed PRNG key
leaf to its key implementation (the key is stored as `jax.random.key_data` and rewrapped on
restore); "checksum" is the SHA-256 of all of it (`checksum`), verified on every read before
anything else, so a flipped bit is reported as corruption, never loaded and never mistaken for
a checkpoint of another run. Version-1 files (no checksum) are still read, with a warning.

Files are written to a temp file, fsynced and atomically renamed, so a file under its final name
is complete: a half-written checkpoint is a `.tmp-*` file that is never listed. A final-named
file that is unreadable (cut short, zero bytes, failed checksum) is skipped when looking for the
newest checkpoint; once a good one is restored, the unreadable newer ones are moved to `corrupt/`
with a warning, so they can neither shadow good ones nor count towards `keep`. When checkpoints
exist but none is readable, `restore_latest` raises `UnreadableCheckpointsError` and changes
nothing on disk. Pruning (`keep`, `keep_best`) only ever counts and deletes readable checkpoints.
"""
from __future__ import annotations

import dataclasses
import hashlib
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

FORMAT, VERSION = "lopt.checkpoint", 2
_NAME = re.compile(r"^ckpt_(\d+)\.msgpack$")
KINDS = ("rolling", "permanent", "best")
CORRUPT_DIR = "corrupt"


class CorruptCheckpointError(ValueError):
    """A file under a checkpoint name that does not decode or fails its checksum (skipped, then set aside)."""


class UnreadableCheckpointsError(ValueError):
    """Checkpoints exist but none is readable: resuming from them, or silently starting over, is refused.

    Args:
        directory: the checkpoint directory.
        unreadable: [(path, why it is unreadable)] of its checkpoints, newest first.
        advice: what the user can do, appended to the message.
    """

    def __init__(self, directory: str, unreadable: Sequence[tuple[str, str]],
                 advice: str = "Move the unreadable files away (or restore good copies) to start over."):
        self.directory, self.unreadable = directory, list(unreadable)
        listing = "".join(f"\n  {path}: {why}" for path, why in self.unreadable)
        super().__init__(f"no checkpoint in {directory} is readable, so the run cannot resume; nothing was "
                         f"changed on disk. The checkpoints and why each is unreadable:{listing}\n{advice}")


@dataclasses.dataclass(frozen=True)
class CheckpointPolicy:
    """When to save checkpoints, of three kinds: rolling (the last `keep` kept), permanent (never
    deleted) and best (the `keep_best` best by a logged metric).

    Attributes:
        every_steps: a rolling checkpoint every this many steps (None: not by steps).
        every_seconds: a rolling checkpoint when this many seconds passed since the last one (None: not by time).
        keep: rolling checkpoints kept (>= 1); older ones are deleted.
        checkpoints_at: steps that get a permanent checkpoint.
        permanent_every: a permanent checkpoint every this many steps (None: none).
        best_metric: a logged metric name (e.g. "eval/final_loss"); a best checkpoint whenever it improves
            (None: no best checkpoints).
        best_mode: "min" or "max": whether lower or higher `best_metric` is better.
        keep_best: best checkpoints kept (>= 1).
        save_final: a rolling checkpoint at the last step, so re-running a finished run does nothing.
    """

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


def check_meta(path: str, saved: dict, expect: dict) -> None:
    """Raises ValueError naming every key of `expect` whose saved value differs, and how.

    Args:
        path: the checkpoint's path (for the message).
        saved: the checkpoint's metadata.
        expect: the metadata this run requires.
    """
    diffs = [f"{k} ({_describe(saved.get(k), want)})" for k, want in expect.items() if saved.get(k) != want]
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
        A metadata or structure mismatch raises ValueError naming what differs.
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
        The state in the template's structure; a metadata or structure mismatch raises ValueError.
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


# ---- files on disk ---------------------------------------------------------------------------------

class CheckpointManager:
    """Saves and finds checkpoints under `directory` according to `policy` (see the module docstring).

    On construction it recovers the best metric value of the readable "best" checkpoints already
    in `directory`, so a resumed run only saves a better one; construction changes nothing on disk.

    Args:
        directory: where the checkpoints go (created on the first save).
        policy: when to save and how many to keep (default `CheckpointPolicy()`).
    """

    def __init__(self, directory: str, policy: Optional[CheckpointPolicy] = None):
        self.directory = directory
        self.policy = policy or CheckpointPolicy()
        self._last_save_time: Optional[float] = None
        self.rescan()

    def rescan(self) -> None:
        """Forgets what it knew of the files in `directory` and recovers the best metric value from the
        readable "best" checkpoints there (None if there are none); call it after files were deleted or
        replaced behind its back. Changes nothing on disk."""
        self._verified: dict[str, tuple[tuple, dict]] = {}  # path -> (stat signature, meta) of readable files
        self.best_value: Optional[float] = None
        values = []
        for _, p in self.list("best"):
            try:
                values.append(self._meta_of(p).get("best_value"))
            except (CorruptCheckpointError, OSError):
                pass  # set aside by the next restore or best save, with a warning
        values = [v for v in values if v is not None]
        if values:
            self.best_value = min(values) if self.policy.best_mode == "min" else max(values)

    def _dir(self, kind: str) -> str:
        return self.directory if kind == "rolling" else os.path.join(self.directory, kind)

    def path(self, kind: str, step: int) -> str:
        """The path of the `kind` ("rolling", "permanent" or "best") checkpoint at `step`."""
        return os.path.join(self._dir(kind), f"ckpt_{int(step):08d}.msgpack")

    def list(self, kind: str) -> list[tuple[int, str]]:
        """[(step, path)] of complete-named checkpoints of `kind` (readable or not), oldest first."""
        d = self._dir(kind)
        if not os.path.isdir(d):
            return []
        found = [(int(m.group(1)), os.path.join(d, n)) for n in os.listdir(d) if (m := _NAME.match(n))]
        return sorted(found)

    def all(self) -> list[tuple[int, str]]:
        """Every checkpoint of every kind (readable or not), newest step first."""
        return sorted((c for k in KINDS for c in self.list(k)), reverse=True)

    def _scan(self) -> tuple[Optional[tuple[str, dict]], list[tuple[str, str]]]:
        """((path, payload) of the newest readable checkpoint or None, [(path, why)] of the unreadable newer ones)."""
        unreadable = []
        for _, p in self.all():
            try:
                return (p, read(p)), unreadable
            except (CorruptCheckpointError, OSError) as e:
                unreadable.append((p, str(e)))
        return None, unreadable

    def latest(self) -> Optional[str]:
        """Path of the newest readable checkpoint, or None; unreadable ones are skipped with a warning.

        Changes nothing on disk (see `restore_latest`, which sets unreadable files aside).
        """
        found, unreadable = self._scan()
        for p, why in unreadable:
            warnings.warn(f"skipping unreadable checkpoint {p}: {why}")
        return found[0] if found else None

    def newest_readable(self) -> Optional[tuple[str, dict, list[tuple[str, str]]]]:
        """The newest checkpoint that reads and passes its checksum; changes nothing on disk.

        Returns:
            None when there is no checkpoint at all; else (path, payload, unreadable): its path, its
            decoded contents (`read`) and [(path, why)] of the unreadable checkpoints newer than it.

        Raises:
            UnreadableCheckpointsError: there are checkpoints, but none is readable.
        """
        found, unreadable = self._scan()
        if found is None:
            if unreadable:
                raise UnreadableCheckpointsError(self.directory, unreadable)
            return None
        return found[0], found[1], unreadable

    def restore_latest(self, template: Any, expect: Optional[dict] = None) -> Optional[tuple[Any, dict]]:
        """`restore` of the newest readable checkpoint of any kind.

        Unreadable newer files are skipped and, once the restore succeeded, moved to `corrupt/` with a
        warning (`set_aside`). A checkpoint that reads but does not match `template`/`expect` raises
        ValueError: it is never skipped. A refused restore changes nothing on disk.

        Args:
            template: the expected state structure (see `restore`), or a function of the checkpoint's
                step returning it (for runs whose state changes structure over time).
            expect: meta keys mapped to required values (see `restore`).

        Returns:
            (state, payload) as `restore` returns them, or None when there is no checkpoint.

        Raises:
            UnreadableCheckpointsError: there are checkpoints, but none is readable.
        """
        found = self.newest_readable()
        if found is None:
            return None
        path, payload, unreadable = found
        template = template(payload["step"]) if callable(template) else template
        state = state_from_payload(payload, template, expect, path)
        for p, why in unreadable:
            self.set_aside(p, why)
        return state, payload

    def set_aside(self, path: str, why: str) -> Optional[str]:
        """Moves an unreadable checkpoint to `directory/corrupt/` (never deleting it), with a warning.

        Args:
            path: the unreadable checkpoint.
            why: why it is unreadable (for the warning).

        Returns:
            Its new path (a numbered name if the first choice is taken), or None when it could not be
            moved (a warning says so; pruning and restores skip it anyway).
        """
        parent = os.path.dirname(os.path.abspath(path))
        kind = "" if parent == os.path.abspath(self.directory) else os.path.basename(parent) + "-"
        target_dir = os.path.join(self.directory, CORRUPT_DIR)
        target = base = os.path.join(target_dir, kind + os.path.basename(path))
        n = 0
        while os.path.lexists(target):
            n += 1
            target = f"{base}.{n}"
        try:
            os.makedirs(target_dir, exist_ok=True)
            os.rename(path, target)
        except OSError as e:
            warnings.warn(f"unreadable checkpoint {path} ({why}) could not be moved aside to {target} ({e}); "
                          f"it is skipped")
            return None
        self._verified.pop(path, None)
        warnings.warn(f"unreadable checkpoint {path} moved aside to {target}: {why}")
        return target

    def _meta_of(self, path: str) -> dict:
        """The metadata of the readable checkpoint at `path` (read once per file version; raises if unreadable)."""
        st = os.stat(path)
        signature = (st.st_ino, st.st_size, st.st_mtime_ns)
        cached = self._verified.get(path)
        if cached is None or cached[0] != signature:
            cached = self._verified[path] = (signature, read(path)["meta"])
        return cached[1]

    def _readable(self, kind: str) -> list[tuple[int, str, dict]]:
        """[(step, path, meta)] of the readable checkpoints of `kind`, oldest first; unreadable ones are set aside."""
        out = []
        for step, p in self.list(kind):
            try:
                out.append((step, p, self._meta_of(p)))
            except (CorruptCheckpointError, OSError) as e:
                self.set_aside(p, str(e))
        return out

    def _write(self, path: str, data: bytes, meta: dict) -> None:
        atomic_write_bytes(path, data)
        st = os.stat(path)
        self._verified[path] = ((st.st_ino, st.st_size, st.st_mtime_ns), json.loads(json.dumps(meta)))

    def mark_time(self, now: float) -> None:
        """Starts the every_seconds clock (call when training starts or resumes)."""
        self._last_save_time = now

    def due(self, step: int, now: float, *, final: bool = False) -> list[str]:
        """Which checkpoints the policy wants after `step`.

        Args:
            step: steps taken.
            now: the current time (`time.perf_counter()`), for `every_seconds`.
            final: whether `step` is the last step (for `save_final`).

        Returns:
            A list with "permanent" and/or "rolling", possibly empty.
        """
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
        """Writes the checkpoint once per kind in `kinds`; prunes readable rolling ones beyond `policy.keep`.

        Unreadable rolling checkpoints are never counted or deleted: they are set aside (`set_aside`).

        Args:
            step: the step the state is at (it names the file).
            state: any pytree of arrays.
            meta: JSON-able metadata stored with it.
            kinds: "rolling" and/or "permanent" (e.g. `due(step, now)`); empty writes nothing.
            now: the current time; a rolling save at a given `now` restarts the every_seconds clock.

        Returns:
            The paths written.
        """
        paths = []
        if not kinds:
            return paths
        data = to_bytes(state, step, meta)
        for kind in kinds:
            path = self.path(kind, step)
            self._write(path, data, meta or {})
            paths.append(path)
        if "rolling" in kinds:
            for _, old, _ in self._readable("rolling")[:-self.policy.keep]:
                _remove(old)
            if now is not None:
                self._last_save_time = now
        return paths

    def is_better(self, value: float) -> bool:
        """Whether `value` of the best metric is finite and beats the best so far (per `policy.best_mode`)."""
        if value is None or not np.isfinite(value):
            return False
        if self.best_value is None:
            return True
        return value < self.best_value if self.policy.best_mode == "min" else value > self.best_value

    def save_best(self, step: int, state: Any, value: float, meta: Optional[dict] = None) -> Optional[str]:
        """Saves a "best" checkpoint if `value` improves on the best so far; keeps the `keep_best` best.

        Only readable best checkpoints are ranked and pruned; unreadable ones are set aside.

        Args:
            step: the step the state is at.
            state: any pytree of arrays.
            value: this step's value of `policy.best_metric` (stored in the metadata as "best_value").
            meta: JSON-able metadata stored with it.

        Returns:
            The path written, or None when `value` is not better.
        """
        if not self.is_better(value):
            return None
        self.best_value = float(value)
        meta = dict(meta or {}, best_metric=self.policy.best_metric, best_value=float(value))
        path = self.path("best", step)
        self._write(path, to_bytes(state, step, meta), meta)
        sign = 1.0 if self.policy.best_mode == "min" else -1.0

        def rank(c):  # best first; a readable file without a value ranks last
            v = c[2].get("best_value")
            return float("inf") if v is None else sign * v

        for _, old, _ in sorted(self._readable("best"), key=rank)[self.policy.keep_best:]:
            _remove(old)
        return path


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass

"""The checkpoints of one directory: saved as a `CheckpointPolicy` says, pruned, found and restored.

    mgr = CheckpointManager(directory, policy)
    mgr.save(step, state, meta={...}, kinds=mgr.due(step, now))   # rolling and/or permanent
    mgr.save_best(step, state, value, meta={...})                  # keeps the `keep_best` best
    found = mgr.latest()                                           # newest readable one, or None
    state, payload = mgr.restore_latest(template, expect={...})    # or None when there is none

Layout under `directory`: `ckpt_<step>.msgpack` (rolling, the last `keep` kept),
`permanent/ckpt_<step>.msgpack`, `best/ckpt_<step>.msgpack`, and `corrupt/`, where unreadable
files are moved aside (never deleted; `corrupt_checkpoints`). Each file is one checksummed
checkpoint (`checkpoint_files`), written to a temp file, fsynced and atomically renamed, so a
file under its final name is complete: a half-written checkpoint is a `.tmp-*` file that is
never listed. Pruning (`keep`, `keep_best`) only ever counts and deletes readable checkpoints.
"""
from __future__ import annotations

import json
import os
import re
import warnings
from typing import Any, Optional, Sequence

from lopt.file_io import atomic_write_bytes
from outer_trainers.runs.checkpoint_files import CorruptCheckpointError, read, state_from_payload, to_bytes
from outer_trainers.runs.checkpoint_policy import CheckpointPolicy
from outer_trainers.runs.corrupt_checkpoints import UnreadableCheckpointsError, first_readable, set_aside

KINDS = ("rolling", "permanent", "best")
_NAME = re.compile(r"^ckpt_(\d+)\.msgpack$")


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
        """The path of a checkpoint.

        Args:
            kind: "rolling", "permanent" or "best".
            step: the step it is taken at.

        Returns:
            `directory/[kind/]ckpt_<step, 8 digits>.msgpack`.
        """
        return os.path.join(self._dir(kind), f"ckpt_{int(step):08d}.msgpack")

    def list(self, kind: str) -> list[tuple[int, str]]:
        """The complete-named checkpoints of one kind, readable or not.

        Args:
            kind: "rolling", "permanent" or "best".

        Returns:
            [(step, path)], oldest first.
        """
        d = self._dir(kind)
        if not os.path.isdir(d):
            return []
        found = [(int(m.group(1)), os.path.join(d, n)) for n in os.listdir(d) if (m := _NAME.match(n))]
        return sorted(found)

    def all(self) -> list[tuple[int, str]]:
        """Every checkpoint of every kind, readable or not.

        Returns:
            [(step, path)], newest step first.
        """
        return sorted((c for k in KINDS for c in self.list(k)), reverse=True)

    def latest(self) -> Optional[str]:
        """The newest readable checkpoint; unreadable newer ones are skipped with a warning.

        Changes nothing on disk (see `restore_latest`, which sets unreadable files aside).

        Returns:
            Its path, or None when no checkpoint is readable.
        """
        found, unreadable = first_readable([p for _, p in self.all()])
        for p, why in unreadable:
            warnings.warn(f"skipping unreadable checkpoint {p}: {why}")
        return found[0] if found else None

    def newest_readable(self) -> Optional[tuple[str, dict, list[tuple[str, str]]]]:
        """The newest checkpoint that reads and passes its checksum; changes nothing on disk.

        Returns:
            None when there is no checkpoint at all; else (path, payload, unreadable): its path, its
            decoded contents (`checkpoint_files.read`) and [(path, why)] of the unreadable checkpoints
            newer than it.

        Raises:
            UnreadableCheckpointsError: there are checkpoints, but none is readable.
        """
        found, unreadable = first_readable([p for _, p in self.all()])
        if found is None:
            if unreadable:
                raise UnreadableCheckpointsError(self.directory, unreadable)
            return None
        return found[0], found[1], unreadable

    def restore_latest(self, template: Any, expect: Optional[dict] = None) -> Optional[tuple[Any, dict]]:
        """`checkpoint_files.restore` of the newest readable checkpoint of any kind.

        Unreadable newer files are skipped and, once the restore succeeded, moved to `corrupt/` with a
        warning (`set_aside`). A checkpoint that reads but does not match `template`/`expect` raises
        ValueError: it is never skipped. A refused restore changes nothing on disk.

        Args:
            template: the expected state structure (see `checkpoint_files.restore`), or a function of the
                checkpoint's step returning it (for runs whose state changes structure over time).
            expect: meta keys mapped to required values (see `checkpoint_files.restore`).

        Returns:
            (state, payload) as `checkpoint_files.restore` returns them, or None when there is no checkpoint.

        Raises:
            UnreadableCheckpointsError: there are checkpoints, but none is readable.
            ValueError: the newest readable checkpoint does not match `template` or `expect`.
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
        """Moves an unreadable checkpoint of this directory to `corrupt/` (`corrupt_checkpoints.set_aside`).

        Args:
            path: the unreadable checkpoint.
            why: why it is unreadable (for the warning).

        Returns:
            Its new path, or None when it could not be moved.
        """
        target = set_aside(self.directory, path, why)
        if target is not None:
            self._verified.pop(path, None)
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
        """Starts the `every_seconds` clock (call when training starts or resumes).

        Args:
            now: the current time (`time.perf_counter()`).
        """
        self._last_save_time = now

    def due(self, step: int, now: float, *, final: bool = False) -> list[str]:
        """Which checkpoints the policy wants after `step` (`CheckpointPolicy.kinds_due`).

        Args:
            step: steps taken.
            now: the current time (`time.perf_counter()`), for `every_seconds`.
            final: whether `step` is the last step (for `save_final`).

        Returns:
            A list with "permanent" and/or "rolling", possibly empty.
        """
        since = None if self._last_save_time is None else now - self._last_save_time
        return self.policy.kinds_due(step, seconds_since_save=since, final=final)

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
        """Whether `value` of the best metric is finite and beats the best so far (`CheckpointPolicy.better`).

        Args:
            value: a value of `policy.best_metric`.

        Returns:
            True when `save_best` would save a checkpoint for it.
        """
        return self.policy.better(value, self.best_value)

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

"""Unreadable checkpoints: found, skipped, set aside in `corrupt/`, never loaded and never deleted.

    found, unreadable = first_readable(paths_newest_first)   # ((path, payload) or None, [(path, why)])
    set_aside(directory, path, why)                          # moved to directory/corrupt/[kind-]name

A file under a checkpoint's final name that is unreadable (cut short, zero bytes, failed checksum)
is skipped when looking for the newest checkpoint; once a good one is restored, the unreadable
newer ones are moved to `corrupt/` with a warning, so they can neither shadow good ones nor count
towards `keep`. When checkpoints exist but none is readable, resuming raises
`UnreadableCheckpointsError` and changes nothing on disk.
"""
from __future__ import annotations

import os
import warnings
from typing import Optional, Sequence

from outer_trainers.runs.checkpoint_files import CorruptCheckpointError, read

CORRUPT_DIR = "corrupt"


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


def first_readable(paths: Sequence[str]) -> tuple[Optional[tuple[str, dict]], list[tuple[str, str]]]:
    """The first of `paths` that reads and passes its checksum, and why each one before it did not.

    Changes nothing on disk.

    Args:
        paths: checkpoint files, in the order to try them (newest first to find the newest readable one).

    Returns:
        (found, unreadable): `found` is (path, payload) of the first readable file (`checkpoint_files.read`)
        or None when none is; `unreadable` is [(path, why)] of the files tried before it.
    """
    unreadable = []
    for path in paths:
        try:
            return (path, read(path)), unreadable
        except (CorruptCheckpointError, OSError) as e:
            unreadable.append((path, str(e)))
    return None, unreadable


def set_aside(directory: str, path: str, why: str) -> Optional[str]:
    """Moves an unreadable checkpoint to `directory/corrupt/` (never deleting it), with a warning.

    A file of a subdirectory (`permanent/`, `best/`) gets its kind as a prefix, and a taken name a
    numbered suffix, so nothing already set aside is replaced.

    Args:
        directory: the checkpoint directory `path` belongs to.
        path: the unreadable checkpoint.
        why: why it is unreadable (for the warning).

    Returns:
        Its new path, or None when it could not be moved (a warning says so; pruning and restores skip
        it anyway).
    """
    parent = os.path.dirname(os.path.abspath(path))
    kind = "" if parent == os.path.abspath(directory) else os.path.basename(parent) + "-"
    target_dir = os.path.join(directory, CORRUPT_DIR)
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
    warnings.warn(f"unreadable checkpoint {path} moved aside to {target}: {why}")
    return target

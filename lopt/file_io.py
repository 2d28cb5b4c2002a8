"""Files written whole or not at all, and msgpack files read with a clear error.

- `atomic_write_bytes(path, data)`: a temp file in the target directory, fsynced, then
  `os.replace`d onto `path`; a crash leaves the old file or the new one, never half of one.
- `read_msgpack_file(path, format_marker, what)`: the msgpack map of a lopt file (theta files,
  checkpoints), raising an error that names the file when it is unreadable or not of that kind.

Used by theta files (`lopt.serialization`), checkpoints, summaries and the scripts.
"""
from __future__ import annotations

import os
import tempfile

from flax import serialization


def atomic_write_bytes(path: str, data: bytes) -> None:
    """Writes `data` to `path` atomically.

    Args:
      path: the destination; its directory is created if missing.
      data: the bytes to write.

    The bytes go to a temp file beside `path`, are fsynced, and the temp file is renamed onto
    `path` (`os.replace`); on any error the temp file is removed and `path` is left as it was.
    """
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=os.path.basename(path))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def read_msgpack_file(path: str, format_marker: str, what: str, error: type = ValueError) -> dict:
    """Reads the msgpack map of a lopt file.

    Args:
      path: the file.
      format_marker: the value its "format" entry must have (e.g. "lopt.theta").
      what: a description for error messages (e.g. "lopt theta file").
      error: the exception type raised for a file that does not decode or lacks the marker.

    Returns:
      The decoded map (a dict).
    """
    with open(path, "rb") as f:
        raw = f.read()
    try:
        payload = serialization.msgpack_restore(raw)
    except Exception as e:  # msgpack raises several types on corrupt or truncated input
        raise error(f"{path} is not a readable {what} ({type(e).__name__}: {e})") from e
    if not isinstance(payload, dict) or payload.get("format") != format_marker:
        raise error(f"{path} is not a {what} (format marker missing)")
    return payload

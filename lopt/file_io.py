"""Files written whole or not at all, and msgpack files read with a clear error.

- `atomic_write_bytes(path, data)`: a temp file in the target directory, fsynced, then
  `os.replace`d onto `path`; a crash leaves the old file or the new one, never half of one.
  The file gets the permissions the umask gives any new file (not `tempfile`'s 0o600).
- `update_markdown_section(path, section)`: replaces one "## " section of a Markdown file (the
  benchmark scripts' way of recording results in docs/benchmarks.md), atomically.
- `read_msgpack_file(path, format_marker, what)`: the msgpack map of a lopt file (theta files,
  checkpoints), raising an error that names the file when it is unreadable or not of that kind.

Used by theta files (`lopt.serialization`), checkpoints, summaries and the scripts.
"""
from __future__ import annotations

import os
import re
import secrets

from flax import serialization


def atomic_write_bytes(path: str, data: bytes) -> None:
    """Writes `data` to `path` atomically, with the permissions any new file gets (the umask applies).

    Args:
      path: the destination; its directory is created if missing.
      data: the bytes to write.

    The bytes go to a new temp file beside `path` (created with mode 0o666, so the process umask
    decides the permissions, as for any file a tool creates), are fsynced, and the temp file is
    renamed onto `path` (`os.replace`), then the directory is fsynced; on any error the temp
    file is removed and `path` is left as it was.
    """
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = _new_temp_file(directory, os.path.basename(path))
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
    _fsync_directory(directory)


def _new_temp_file(directory: str, name: str) -> tuple[int, str]:
    """A new file `.tmp-<random>-<name>` in `directory`, opened for writing; mode 0o666 less the umask.

    `tempfile.mkstemp` would create it 0o600 whatever the umask; `O_EXCL` keeps the name unique.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    for _ in range(100):
        tmp = os.path.join(directory, f".tmp-{secrets.token_hex(6)}-{name}")
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"could not create a temp file for {name} in {directory}")


def _fsync_directory(directory: str) -> None:
    """Makes a rename in `directory` durable (where the platform allows opening a directory)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


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


def replace_markdown_section(doc: str, section: str) -> str:
    """Replaces one "## " section of a Markdown text.

    Args:
      doc: the Markdown text.
      section: the new section; its first line is the heading ("## Title").

    Returns:
      `doc` with the section that has the same heading (up to the next "## " heading or the end)
      replaced by `section`; if there is none, `section` appended (after "# Benchmarks" for an
      empty `doc`).
    """
    heading = section.splitlines()[0].strip()
    pattern = re.compile(rf"^{re.escape(heading)}\s*$.*?(?=^## |\Z)", re.M | re.S)
    if pattern.search(doc):
        return pattern.sub(lambda _: section + "\n", doc, count=1).rstrip("\n") + "\n"
    head = doc.rstrip("\n")
    return (head + "\n\n" if head else "# Benchmarks\n\n") + section


def update_markdown_section(path: str, section: str) -> None:
    """`replace_markdown_section` on the file at `path` (created if missing), written atomically."""
    doc = ""
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            doc = f.read()
    atomic_write_bytes(path, replace_markdown_section(doc, section).encode("utf-8"))

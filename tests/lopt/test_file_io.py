"""lopt.file_io: atomic writes (permissions from the umask), msgpack reads, Markdown sections of the
benchmark page."""
import os
import stat

import pytest

from lopt import file_io


def test_replace_section_keeps_other_sections():
    doc = "# Benchmarks\n\n## Estimators\n\nfast\n\n## Optimizer step\n\nold table\n\n## Tasks\n\nx\n"
    out = file_io.replace_markdown_section(doc, "## Optimizer step\n\nnew table\n")
    assert "## Estimators\n\nfast" in out and "## Tasks\n\nx" in out
    assert "new table" in out and "old table" not in out
    assert out.index("## Estimators") < out.index("new table") < out.index("## Tasks")


def test_replace_section_appends_when_missing():
    assert file_io.replace_markdown_section("", "## Optimizer step\n\nt\n").startswith(
        "# Benchmarks\n\n## Optimizer step")
    out = file_io.replace_markdown_section("# Benchmarks\n\n## Estimators\n\nfast\n", "## Optimizer step\n\nt\n")
    assert out.endswith("## Optimizer step\n\nt\n") and "fast" in out


def test_update_markdown_section_writes_the_file(tmp_path):
    path = str(tmp_path / "bench.md")
    file_io.update_markdown_section(path, "## A\n\none\n")
    file_io.update_markdown_section(path, "## A\n\ntwo\n")
    with open(path, encoding="utf-8") as f:
        assert f.read() == "# Benchmarks\n\n## A\n\ntwo\n"
    assert os.listdir(tmp_path) == ["bench.md"]  # no temp files left behind


def test_atomic_write_leaves_the_old_file_on_error(tmp_path):
    path = str(tmp_path / "f.bin")
    file_io.atomic_write_bytes(path, b"old")
    with pytest.raises(TypeError):
        file_io.atomic_write_bytes(path, object())  # not bytes: the write fails
    with open(path, "rb") as f:
        assert f.read() == b"old"
    assert os.listdir(tmp_path) == ["f.bin"]


def test_read_msgpack_file_names_the_file(tmp_path):
    path = str(tmp_path / "x.msgpack")
    file_io.atomic_write_bytes(path, b"\xc1\xc1 not msgpack")
    with pytest.raises(ValueError, match="x.msgpack is not a readable thing"):
        file_io.read_msgpack_file(path, "lopt.thing", "thing")


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_atomic_write_respects_the_umask(tmp_path, umask, mode):
    path = str(tmp_path / "f.bin")
    old = os.umask(umask)
    try:
        file_io.atomic_write_bytes(path, b"new")
        file_io.atomic_write_bytes(path, b"newer")  # replacing a file too
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path).st_mode) == mode
    assert os.listdir(tmp_path) == ["f.bin"]

"""One build of the documentation site, shared by the docs tests: README's own docs command.

`built_site` runs the `sphinx-build` command that README.md gives users, with its arguments
unchanged (so it must carry `-W`: warnings are errors), plus `-n --keep-going` (every
cross-reference must resolve; all warnings are reported, not only the first). It runs from a
temporary directory holding a fresh copy of docs/ (no `_build`, so no executed-notebook cache and
no generated API pages from an earlier build), so every tutorial in docs/tutorials/ executes, as on
a clean clone. The only difference from a user's build is LOPT_TUTORIAL_FAST=1, which makes the
tutorials shrink their step counts (about a minute each on 2 CPU cores).
"""
import os
import re
import shlex
import shutil
import subprocess
import sys
from typing import NamedTuple

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = os.path.join(ROOT, "docs")
TUTORIALS = os.path.join(DOCS, "tutorials")
# produced by the build inside the source folder, and absent from a clean clone (.gitignore)
BUILD_PRODUCTS = ("_build", os.path.join("api", "generated"))


def readme_docs_command() -> list:
    """The arguments of README.md's `sphinx-build` command (without the program name)."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        commands = set(re.findall(r"sphinx-build [^\n`&|;]*", f.read()))
    assert len(commands) == 1, f"README.md should give one sphinx-build command, found {sorted(commands)}"
    return shlex.split(commands.pop())[1:]


def tutorial_names(docs_dir: str = DOCS) -> list:
    """The tutorials (tutorials/*.md of a docs folder, but the conventions page), without the extension."""
    folder = os.path.join(docs_dir, "tutorials")
    return sorted(f[:-3] for f in os.listdir(folder) if f.endswith(".md") and f != "README.md")


def source_files(docs_dir) -> set:
    """Files under a docs folder, relative to it, leaving out what the build itself writes there."""
    found = set()
    for parent, dirs, files in os.walk(docs_dir):
        rel = os.path.relpath(parent, docs_dir)
        dirs[:] = [d for d in dirs if os.path.normpath(os.path.join(rel, d)) not in BUILD_PRODUCTS]
        found.update(os.path.normpath(os.path.join(rel, f)) for f in files)
    return found


class Site(NamedTuple):
    html: str            # the HTML output folder
    docs: str            # the copy of docs/ that was built
    sources: set         # its files before the build (source_files)


@pytest.fixture(scope="session")
def built_site(tmp_path_factory) -> Site:
    pytest.importorskip("sphinx", reason='the docs extra is not installed: pip install -e ".[test]"')
    pytest.importorskip("myst_nb", reason='the docs extra is not installed: pip install -e ".[test]"')
    args = readme_docs_command()
    assert "-W" in args, f"README's docs command does not make warnings errors (-W): {args}"
    assert args[-2:] == ["docs", "docs/_build/html"], f"README's docs command builds {args[-2:]}"
    work = tmp_path_factory.mktemp("site")
    docs = work / "docs"
    shutil.copytree(DOCS, docs, ignore=shutil.ignore_patterns("_build", "generated", ".ipynb_checkpoints",
                                                                "__pycache__"))
    sources = source_files(docs)
    env = dict(os.environ, LOPT_TUTORIAL_FAST="1")
    proc = subprocess.run([sys.executable, "-m", "sphinx", *args, "-n", "--keep-going"], cwd=work, env=env,
                          capture_output=True, text=True, timeout=2400)
    log = f"{proc.stdout}\n{proc.stderr}"
    assert proc.returncode == 0, f"README's docs command (with -n --keep-going) failed:\n{log[-20000:]}"
    return Site(html=str(docs / "_build" / "html"), docs=str(docs), sources=sources)

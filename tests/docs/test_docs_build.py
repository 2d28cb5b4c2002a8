"""The documentation site builds in strict mode, and its API reference covers every public name.

Runs `sphinx-build -W --keep-going -n` (warnings are errors, every cross-reference must resolve)
on a copy of docs/ in a temporary directory, without executing the notebooks (their execution
is tests/docs/test_tutorials.py's job). A malformed docstring or a broken reference fails here.
"""
import importlib
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = os.path.join(ROOT, "docs")
PACKAGES = ("lopt", "outer_trainers", "tasks", "tasks.datasets")

pytest.importorskip("sphinx", reason='the docs extra is not installed: pip install -e ".[test]"')
pytest.importorskip("myst_nb", reason='the docs extra is not installed: pip install -e ".[test]"')


@pytest.fixture(scope="module")
def built_site(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("docs")
    src = tmp / "docs"
    shutil.copytree(DOCS, src, ignore=shutil.ignore_patterns("_build", "generated", ".ipynb_checkpoints"))
    out = tmp / "html"
    env = dict(os.environ, LOPT_DOCS_EXECUTE="off")
    cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-W", "--keep-going", "-n", "-q",
           "-d", str(tmp / "doctrees"), str(src), str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"strict docs build failed:\n{proc.stdout}\n{proc.stderr}"
    return out


def test_docs_build_strictly_without_warnings(built_site):
    assert (built_site / "index.html").exists()
    assert (built_site / "api" / "index.html").exists()


@pytest.mark.parametrize("package", PACKAGES)
def test_api_reference_lists_every_public_name(built_site, package):
    """Each name in the package's __all__ has its own page, linked from the package's page."""
    mod = importlib.import_module(package)
    page = (built_site / "api" / "generated" / f"{package}.html").read_text(encoding="utf-8")
    missing = [name for name in mod.__all__
               if not (built_site / "api" / "generated" / f"{package}.{name}.html").exists()
               or f'href="{package}.{name}.html' not in page]
    assert not missing, f"{package}.__all__ names without an API page: {missing}"


def test_tutorials_are_in_the_site(built_site):
    tutorials = [f[:-3] for f in os.listdir(os.path.join(DOCS, "tutorials"))
                 if f.endswith(".md") and f != "README.md"]
    assert tutorials
    for name in tutorials:
        assert (built_site / "tutorials" / f"{name}.html").exists(), f"tutorial {name} is not in the site"

"""Every tutorial notebook in docs/tutorials/ follows the conventions and runs top to bottom.

The tutorials are MyST markdown notebooks (see docs/tutorials/README.md). They are executed once,
by the site build of tests/docs/conftest.py (myst-nb, in a real Jupyter kernel "python3", with
LOPT_TUTORIAL_FAST=1 so that each shrinks its step counts): a cell that raises fails that build,
and a tutorial's last cell asserts its key result, so a claim that stops holding fails there.
"""
import os

import pytest

from tests.docs.conftest import TUTORIALS, tutorial_names

jupytext = pytest.importorskip("jupytext", reason='the docs extra is not installed: pip install -e ".[test]"')

NAMES = tutorial_names()


def test_tutorials_are_myst_notebooks():
    assert NAMES, "no tutorials found"
    for name in NAMES:
        nb = jupytext.read(os.path.join(TUTORIALS, f"{name}.md"))
        assert nb.metadata.get("kernelspec", {}).get("name") == "python3", f"{name}: kernelspec python3 expected"
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert code and "LOPT_TUTORIAL_FAST" in code[0].source, f"{name}: the first code cell must read LOPT_TUTORIAL_FAST"
        assert "assert" in code[-1].source, f"{name}: the last code cell must assert the tutorial's key result"


@pytest.mark.slow  # the site build executes every tutorial: the slow tier, on the docs build's xdist worker
@pytest.mark.xdist_group("docs")
@pytest.mark.parametrize("name", NAMES)
def test_tutorial_executes(built_site, name):
    """The tutorial's page shows the outputs of its run, and the run raised nothing."""
    with open(os.path.join(built_site.html, "tutorials", f"{name}.html"), encoding="utf-8") as f:
        page = f.read()
    assert "cell_output" in page, f"{name}: the site shows no output of it (not executed?)"
    assert 'class="output traceback' not in page, f"{name}: the page shows an error"
    assert not os.path.exists(os.path.join(built_site.html, "reports", f"{name}.err.log")), f"{name}: execution failed"

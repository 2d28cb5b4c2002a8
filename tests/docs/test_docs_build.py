"""The documentation site builds as README.md says, in strict mode, and it is complete.

`built_site` (tests/docs/conftest.py) runs README's `sphinx-build -W` command (plus `-n`: every
cross-reference must resolve) on a fresh copy of docs/, executing every tutorial. A malformed
docstring, a broken reference, an image the site cannot find or a tutorial that fails fails here.
"""
import importlib
import os
import re

import pytest

from tests.docs.conftest import source_files, tutorial_names

# The slow tier: one site build with every tutorial executed (a few minutes), on one xdist worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("docs")]

PACKAGES = ("lopt", "outer_trainers", "tasks", "tasks.datasets")


def test_docs_build_strictly_without_warnings(built_site):
    """The build passed with -W (any warning is an error, built_site asserts its exit status)."""
    assert os.path.exists(os.path.join(built_site.html, "index.html"))
    assert os.path.exists(os.path.join(built_site.html, "api", "index.html"))


def test_every_image_of_the_site_exists(built_site):
    """Each <img> of each page points at a file of the site (or embeds its data)."""
    missing, count = [], 0
    for parent, _, files in os.walk(built_site.html):
        for name in (f for f in files if f.endswith(".html")):
            with open(os.path.join(parent, name), encoding="utf-8") as f:
                sources = re.findall(r"<img\b[^>]*?\bsrc=\"([^\"]+)\"", f.read())
            for src in sources:
                count += 1
                if not src.startswith(("data:", "http://", "https://")) and not os.path.isfile(
                        os.path.join(parent, src.split("#")[0].split("?")[0])):
                    missing.append(f"{os.path.relpath(os.path.join(parent, name), built_site.html)}: {src}")
    assert count, "the site shows no image at all: were the tutorials executed?"
    assert not missing, f"images that are not in the site: {missing}"


def test_building_writes_nothing_into_the_sources(built_site):
    """Executing the tutorials leaves docs/ as it was, but for the build's own output folders."""
    assert source_files(built_site.docs) == built_site.sources, \
        sorted(source_files(built_site.docs) ^ built_site.sources)


@pytest.mark.parametrize("package", PACKAGES)
def test_api_reference_lists_every_public_name(built_site, package):
    """Each name in the package's __all__ has its own page, linked from the package's page."""
    mod = importlib.import_module(package)
    generated = os.path.join(built_site.html, "api", "generated")
    with open(os.path.join(generated, f"{package}.html"), encoding="utf-8") as f:
        page = f.read()
    missing = [name for name in mod.__all__
               if not os.path.exists(os.path.join(generated, f"{package}.{name}.html"))
               or f'href="{package}.{name}.html' not in page]
    assert not missing, f"{package}.__all__ names without an API page: {missing}"


def test_tutorials_are_in_the_site(built_site):
    names = tutorial_names(built_site.docs)
    assert names
    for name in names:
        assert os.path.exists(os.path.join(built_site.html, "tutorials", f"{name}.html")), \
            f"tutorial {name} is not in the site"

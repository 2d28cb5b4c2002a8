"""Sphinx configuration of the lopt documentation site.

Build it locally, as README.md says (the tutorials execute, cached under docs/_build/.jupyter_cache;
-W: a warning is an error):

    pip install -e ".[docs]" && sphinx-build -W -b html docs docs/_build/html

Add `-D nb_execution_mode=off` for the pages without the tutorials' outputs (no execution).
The test suite runs that same command, plus -n (every cross-reference resolves), on a fresh copy
of docs/ with LOPT_TUTORIAL_FAST=1 (tests/docs/conftest.py).
No extension here touches the network (no intersphinx): references to third-party types are
listed in nitpick_ignore_regex below instead.
"""
import os
import re

project = "lopt"
author = "lopt contributors"
copyright = "lopt contributors"

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "myst_nb",
]

source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
root_doc = "index"
default_role = "code"       # docstrings write `code` in single backticks (Markdown style): render it as code
templates_path = ["_templates"]
exclude_patterns = ["_build", "**/.ipynb_checkpoints", "tutorials/README.md", "Thumbs.db", ".DS_Store"]

# --- API reference: one page per package, listing every name in its __all__ -----------------
autosummary_generate = True
autosummary_ignore_module_all = False     # a package page lists exactly the names in __all__
autosummary_imported_members = False
autodoc_default_options = {"members": True}
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_class_signature = "mixed"
autodoc_preserve_defaults = True
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_attr_annotations = True
napoleon_use_ivar = True   # Attributes: as fields, not a second description of each dataclass field

# Nitpicky mode (-n) resolves every cross-reference. The project's own names must resolve;
# third-party and builtin-typing names have no inventory offline (no intersphinx: the build
# must not fetch), so they are ignored by module prefix, narrowly.
nitpick_ignore_regex = [
    (r"py:.*", r"(jax|jaxlib|jnp|optax|chex|flax|nnx|haiku|hk|numpy|np|gin|msgpack|tensorboardX)(\..*)?"),
    (r"py:.*", r"(typing|collections\.abc|types|os|pathlib|dataclasses|concurrent\.futures|threading)\..*"),
    (r"py:class", r"(Any|Callable|Sequence|Mapping|Iterable|Iterator|NamedTuple|PathLike|Path|Array|PyTree|"
                  r"ArrayTree|PRNGKey|Params|Updates|OptState|ndarray|ArrayLike|DTypeLike|Shape)"),
]

# A name exported by a package and by one of its subpackages (the same object) is described once,
# on the subpackage's page; the package's page links to it (otherwise: duplicate descriptions).
REEXPORTS = {"tasks.DataSource": "tasks.datasets.DataSource"}
autosummary_context = {"reexports": REEXPORTS}



_CODE = re.compile(r"(``.*?``|`[^`]*`)")            # inline literals / roles: left alone
_FIELD = re.compile(r"^(\s*:[^:]+:)(.*)$")          # ":param name:" etc. (napoleon's output)


def _escape_prose(text: str) -> str:
    parts = _CODE.split(text)
    for i in range(0, len(parts), 2):
        # shapes are written [K, *p.shape]: that `*` is literal, not reST emphasis
        parts[i] = re.sub(r"(?<=[\[\s])\*(?=p\b)", r"\\*", parts[i])
        # a word ending in "_" (an identifier such as "text_") is literal, not a reST hyperlink reference
        parts[i] = re.sub(r"(?<=\w)_(?=[\s\"'),.;:]|$)", r"\\_", parts[i])
    return "".join(parts)


def _docstrings_are_not_rest(app, what, name, obj, options, lines):
    """The docstrings are Google style with Markdown-ish prose, not reST: two constructs that
    reST would misread are made literal (after napoleon, outside inline literals and field names)."""
    for i, line in enumerate(lines):
        m = _FIELD.match(line)
        lines[i] = m.group(1) + _escape_prose(m.group(2)) if m else _escape_prose(line)


def _property_docs_are_prose(app, what, name, obj, options, lines):
    """Napoleon reads a property docstring's first line "X: y" as "type: description" and emits
    ":type: X"; here properties carry their type as a return annotation and their docstrings
    are prose ("The task family's name: ..."), so the first line is put back together."""
    if what != "property":
        return
    typed = [i for i, line in enumerate(lines) if line.startswith(":type: ")]
    if typed:
        prose = lines.pop(typed[0])[len(":type: "):]
        while lines and not lines[-1].strip():
            lines.pop()
        first = next((i for i, line in enumerate(lines) if line.strip()), None)
        if first is None:
            lines.append(prose)
        else:
            lines[first] = f"{prose}: {lines[first]}"


def setup(app):
    # both after napoleon (priority 500), in this order
    app.connect("autodoc-process-docstring", _property_docs_are_prose, priority=600)
    app.connect("autodoc-process-docstring", _docstrings_are_not_rest, priority=601)


# --- notebooks (MyST markdown notebooks in tutorials/, see tutorials/README.md) ----------------
# Executed when the site is built, and cached: a tutorial runs again only when it changes.
nb_execution_mode = "cache"
nb_execution_timeout = 1800
nb_execution_raise_on_error = True     # a failing tutorial fails the build
nb_execution_show_tb = True            # ... and the build's output shows the cell's traceback
nb_execution_cache_path = os.path.join(os.path.dirname(__file__), "_build", ".jupyter_cache")
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence"]
myst_heading_anchors = 3

# --- HTML ----------------------------------------------------------------------------------------
html_theme = "furo"
html_title = "lopt"
html_static_path = []

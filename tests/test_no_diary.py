"""Docs and code comments say what is true now; the history of how it got there lives in git log.

Checked: the .md files under docs/, README.md and CONTRIBUTING.md (every line); the comments and
docstrings of the .py files of lopt/, outer_trainers/, tasks/ and scripts/; the comments of
scripts/configs/*.gin. None may carry

- an issue or pull-request reference: "issue #12", "issue-#12", "#12's", "(#12)", "(#12, #13)",
  "PR #12";
- a work-log phrase about a working session: "the third session", "lent for one working session"
  (a run's own sessions, "the session that resumes a run", are a concept of lopt, not a log);
- a dated note: an ISO date such as 2026-11-28, "Nov 28, 2026" / "28 November 2026", or
  "measured on <a date>".

Code itself is not read, so "#" in code, hex colours and markdown anchors are no concern; only
"#" followed by digits in the shapes above counts.
"""
import ast
import io
import os
import re
import tokenize

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY_DIRS = ("lopt", "outer_trainers", "tasks", "scripts")

_MONTH = (r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?|"
          r"Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)")
PATTERN = re.compile(
    "|".join([
        r"\b(?:issues?|PRs?|pull requests?)[\s-]*#\d+",          # issue #12, issue-#2, PR #3
        r"(?<![\w&])#\d+'s\b",                                   # #12's
        r"\(#\d+(?:,\s*#\d+)*\)",                                # (#12), (#12, #13)
        r"\b(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth) session\b",  # work log
        r"\bworking session\b",
        r"\b20\d\d-[01]\d-[0-3]\d\b",                            # 2026-11-28
        rf"\b{_MONTH}\.? [0-3]?\d(?:st|nd|rd|th)?,? 20\d\d\b",  # Nov 28, 2026
        rf"\b[0-3]?\d {_MONTH} 20\d\d\b",                        # 28 November 2026
        rf"\bmeasured (?:on|in) (?:{_MONTH}\b|20\d\d\b|\d)",     # measured on <date>
    ]),
    re.IGNORECASE)


def _files(top, suffix, skip=()):
    for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, top)):
        dirnames[:] = sorted(d for d in dirnames if d not in ("__pycache__", "_build") and not d.startswith("."))
        rel = os.path.relpath(dirpath, ROOT)
        if any(rel == s or rel.startswith(s + os.sep) for s in skip):
            continue
        for name in sorted(filenames):
            if name.endswith(suffix):
                yield os.path.join(dirpath, name)


def _md_lines(path):
    with open(path, encoding="utf-8") as f:
        yield from enumerate(f, 1)


def _py_prose(path):
    """(line number, text) of every comment and docstring line of a Python file."""
    source = open(path, encoding="utf-8").read()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                for i, line in enumerate(body[0].value.value.splitlines()):
                    yield body[0].lineno + i, line


def _gin_comments(path):
    """(line number, text) of every comment of a gin file (from a '#' outside a string on)."""
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            quote = None
            for j, ch in enumerate(line):
                if quote:
                    if ch == quote:
                        quote = None
                elif ch in "\"'":
                    quote = ch
                elif ch == "#":
                    yield i, line[j:]
                    break


def _sources():
    docs = [os.path.join(ROOT, n) for n in ("README.md", "CONTRIBUTING.md") if os.path.exists(os.path.join(ROOT, n))]
    docs += list(_files("docs", ".md"))
    for path in docs:
        yield path, _md_lines(path)
    for top in PY_DIRS:
        for path in _files(top, ".py"):
            yield path, _py_prose(path)
    for path in _files(os.path.join("scripts", "configs"), ".gin"):
        yield path, _gin_comments(path)


def _hits(lines):
    return [(i, text.strip()) for i, text in lines if PATTERN.search(text)]


def test_pattern_flags_diary_and_spares_code():
    diary = ["see issue #13", "the issue-#2 problems", "after #17's refactor", "the brake (#21)", "fixed (#3, #4)",
             "the third session measured", "lent for one working session", "timed 2026-11-28 on the VM",
             "Nov 28, 2026",
             "28 November 2026", "measured on 2026-11-02", "measured on Nov 3"]
    clean = ["x = a[0]  # first axis", "color: #1f77b4;", "[below](#long-runs-the-horizon-rule)",
             "#123456", "Large et al. 2024", "shape (2, 3)", "a Ray session", "measured on an H100",
             "when this session started", "the 1st, 2nd and 3rd session of a run",
             "step #3 of the loop", "opt_state = tx.init(params)  # 2. as any optax optimizer"]
    assert all(PATTERN.search(s) for s in diary), [s for s in diary if not PATTERN.search(s)]
    assert not any(PATTERN.search(s) for s in clean), [s for s in clean if PATTERN.search(s)]


def test_no_diary_in_docs_and_comments():
    hits = []
    for path, lines in _sources():
        hits += [f"{os.path.relpath(path, ROOT)}:{i}: {text[:90]}" for i, text in _hits(lines)]
    assert not hits, ("issue numbers, work-log notes or dates in docs or comments (say what is true now; "
                      "history belongs in git log):\n" + "\n".join(hits))

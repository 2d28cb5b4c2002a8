"""The README's promises: its test command is exactly what CI runs; its commands and snippet are real."""
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _read(*parts):
    with open(os.path.join(ROOT, *parts), encoding="utf-8") as f:
        return f.read()


def _test_commands(text):
    """The test-tier commands of a file: lines that run pytest (the fast tier's starts with its install)."""
    return [l for l in text.splitlines() if l.startswith(("pip install", "python -m pytest")) and "pytest" in l]


def test_ci_runs_the_readme_test_commands_fast_tier_first():
    """.ci/run runs README's two test commands, nothing else: the fast tier (installing the test extra), then the
    slow tier; together they select every test, each invocation printing coverage (the second tier appending)."""
    ci = _test_commands(_read(".ci", "run"))
    readme = _read("README.md").splitlines()
    assert len(ci) == 2 and all(c in readme for c in ci), ci
    fast, slow = ci
    assert fast.startswith('pip install -e ".[test]" && ') and readme.index(fast) < readme.index(slow)
    assert '-m "multidevice and not slow"' in fast and '-m "slow and not multidevice"' in slow
    assert '-m "multidevice and slow"' in slow
    parts = [p.strip() for p in fast.split("&&")[1:] + slow.split("&&")]
    assert parts[0].endswith(" --cov") and all(p.endswith(" --cov --cov-append") for p in parts[1:]), parts


def test_the_default_pytest_run_is_the_fast_tier():
    """pytest.ini's default selection is what the fast command's first invocation runs (no -m of its own)."""
    assert 'addopts = -ra --durations=30 --dist loadgroup -m "not slow and not multidevice"' in _read("pytest.ini")
    fast = _test_commands(_read(".ci", "run"))[0]
    assert fast.split("&&")[1].strip() == "python -m pytest -n auto --cov"


def test_readme_quickstart_command_points_at_real_files():
    readme = _read("README.md")
    m = re.search(r"python (scripts/\S+\.py) --gin_file (\S+\.gin)", readme)
    assert m, "README lacks the quickstart command"
    assert os.path.exists(os.path.join(ROOT, m.group(1)))
    assert os.path.exists(os.path.join(ROOT, m.group(2)))


def test_readme_snippet_names_exist():
    import lopt
    import outer_trainers as ot
    import tasks

    for mod, names in ((tasks, ["QuadraticFamily"]), (lopt, ["MLPLOpt", "save_theta", "load_optimizer"]),
                       (ot, ["LOptTruncatedStep", "LogUniformTruncationSchedule", "TruncatedPES",
                             "GradientLearner", "outer_train"])):
        for n in names:
            assert hasattr(mod, n), f"{mod.__name__}.{n} is in the README but not in the package"


def test_readme_notebook_snippet_runs(tmp_path):
    """Executes the README's notebook snippet (with fewer outer steps) and checks its promise."""
    import optax

    readme = _read("README.md")
    code = re.search(r"## In a notebook\s+```python\n(.*?)```", readme, re.S).group(1)
    assert "num_steps=100" in code
    namespace = {}
    exec(compile(code.replace("num_steps=100", "num_steps=2"), "README.md", "exec"), namespace)
    tx = namespace["tx"]
    assert isinstance(tx, optax.GradientTransformationExtraArgs)
    assert namespace["state"].step == 2


def test_readme_pretrained_optimizer_is_shipped():
    import lopt.pretrained

    names = re.findall(r'lopt\.pretrained\.load\("([^"]+)"', _read("README.md"))
    assert names and all(n in lopt.pretrained.names() for n in names), names


def test_readme_docs_command_is_strict_and_is_what_the_docs_test_runs():
    """README promises a warning-free site: its docs command has -W, and tests/docs/conftest.py runs it."""
    from tests.docs.conftest import readme_docs_command

    args = readme_docs_command()
    assert "-W" in args, f"README's sphinx-build command lacks -W: {args}"
    assert args[-2:] == ["docs", "docs/_build/html"], args
    assert 'pip install -e ".[docs]" && sphinx-build ' + " ".join(args) in _read("README.md").splitlines()

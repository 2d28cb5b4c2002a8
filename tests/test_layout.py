"""The layout rules a newcomer relies on: small modules, small packages, no import cycle, no ambient state.

- no module of lopt, outer_trainers, tasks or scripts over 400 lines;
- at most 15 modules at the top level of any package;
- no import cycle between the modules of the three packages (every import statement, read with `ast`);
- run files (outer_trainers.runs) and the model training loop (outer_trainers.training) import no
  meta-training code (steps, estimators, learner, distributed);
- no `contextvars` in lopt/ (how an update is computed depends on its arguments and shapes);
- no public function or method of lopt, outer_trainers, tasks or scripts with more than 20 parameters
  (settings that belong together go in a documented config dataclass, e.g. `Reporting`, `EvalPlan`).
"""
import ast
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("lopt", "outer_trainers", "tasks")
MAX_LINES = 400
MAX_MODULES = 15


def _python_files(top):
    for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, top)):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for name in filenames:
            if name.endswith(".py"):
                yield os.path.join(dirpath, name)


def _module_name(path):
    rel = os.path.relpath(path, ROOT)[:-len(".py")].split(os.sep)
    return ".".join(rel[:-1] if rel[-1] == "__init__" else rel)


def _import_graph():
    """{module: set of modules of the three packages it imports (anywhere in it)}."""
    modules = {_module_name(p): p for top in PACKAGES for p in _python_files(top)}
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(open(path, encoding="utf-8").read())
        is_pkg = path.endswith("__init__.py")
        deps = set()
        for node in ast.walk(tree):  # imports inside functions count too: they tie the modules just the same
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = name.split(".")[: len(name.split(".")) - node.level + (1 if is_pkg else 0)]
                    base = ".".join(parts + ([base] if base else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            for t in targets:
                while t and t not in modules:
                    t = t.rpartition(".")[0]
                if t and t != name:
                    deps.add(t)
        graph[name] = deps
    return graph


def _cycle(graph):
    """One import cycle as a list of modules, or None. Imports of a package's own parents are
    not edges of a cycle here when the parent only re-exports (Python resolves them in order),
    so only module -> module edges between non-__init__ modules are followed, plus __init__
    edges to modules outside the package."""
    state, stack = {}, []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if node.startswith(dep + "."):  # a module importing its own package: resolved by Python
                continue
            if state.get(dep) == 1:
                return stack[stack.index(dep):] + [dep]
            if dep not in state:
                found = visit(dep)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_no_module_over_400_lines():
    long = []
    for top in PACKAGES + ("scripts",):
        for path in _python_files(top):
            n = sum(1 for _ in open(path, encoding="utf-8"))
            if n > MAX_LINES:
                long.append(f"{os.path.relpath(path, ROOT)}: {n} lines")
    assert not long, "modules over 400 lines (split them by concept):\n" + "\n".join(long)


def test_at_most_15_modules_per_package():
    crowded = []
    for top in PACKAGES:
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, top)):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            if "__init__.py" not in filenames:
                continue
            mods = [f for f in filenames if f.endswith(".py") and f != "__init__.py"]
            if len(mods) > MAX_MODULES:
                crowded.append(f"{os.path.relpath(dirpath, ROOT)}: {len(mods)} modules")
    assert not crowded, "packages with more than 15 top-level modules:\n" + "\n".join(crowded)


def test_no_import_cycle():
    cycle = _cycle(_import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("package", ["outer_trainers.runs", "outer_trainers.training"])
def test_run_files_and_training_loop_import_no_meta_training(package):
    meta = ("outer_trainers.steps", "outer_trainers.estimators", "outer_trainers.learner",
            "outer_trainers.distributed")
    graph = _import_graph()
    bad = [f"{mod} imports {dep}" for mod, deps in graph.items() if mod == package or mod.startswith(package + ".")
           for dep in deps if dep.startswith(meta)]
    assert not bad, "\n".join(bad)


def test_no_context_variables_in_lopt():
    users = [os.path.relpath(p, ROOT) for p in _python_files("lopt")
             if re.search(r"\bcontextvars\b", open(p, encoding="utf-8").read())]
    assert not users, f"lopt modules using contextvars (pass the choice as an argument): {users}"


def test_torch_mirrors_the_jax_module_names_and_no_architecture_module_imports_another():
    def modules(package):
        directory = os.path.join(ROOT, *package.split("."))
        return {f[:-len(".py")] for f in os.listdir(directory) if f.endswith(".py") and f != "__init__.py"}

    graph = _import_graph()
    assert modules("lopt.torch.archs") <= modules("lopt.archs"), "a torch architecture module without its JAX module"
    for package, parts in (("lopt.archs", "lopt.parts"), ("lopt.torch.archs", "lopt.torch.parts")):
        archs = {f"{package}.{m}" for m in modules(package)}
        siblings = [f"{mod} imports {dep}" for mod in sorted(archs) for dep in sorted(graph[mod]) if dep in archs]
        assert not siblings, f"architecture modules share helpers through {parts}:\n" + "\n".join(siblings)
    torch_to_jax_archs = [f"{mod} imports {dep}" for mod in graph if mod.startswith("lopt.torch.")
                          for dep in graph[mod] if dep.startswith("lopt.archs.")]
    assert not torch_to_jax_archs, ("lopt.torch reads an architecture's public configuration and spec from the "
                                    "instance it is given, not its module:\n" + "\n".join(torch_to_jax_archs))
    unmirrored = [f"lopt.torch.{sub}.{m} (no lopt.{sub}.{m})" for sub in ("archs", "parts", "rules")
                  for m in sorted(modules(f"lopt.torch.{sub}") - modules(f"lopt.{sub}"))]
    assert not unmirrored, "lopt.torch modules without a JAX module of the same name:\n" + "\n".join(unmirrored)


MAX_PARAMETERS = 20


def _parameter_counts(tree: ast.AST):
    """(qualified name, parameter count) of every public function and method of a module (`self`/`cls` and
    `*args`/`**kwargs` not counted, keyword-only ones counted); private names and those inside a private class
    left out."""
    def visit(node, prefix, in_class):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = child.args
                names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
                if in_class and names[:1] in (["self"], ["cls"]):
                    names = names[1:]
                private = child.name.startswith("_") and not child.name.startswith("__")
                if not private:
                    yield prefix + child.name, len(names)
            elif isinstance(child, ast.ClassDef) and not child.name.startswith("_"):
                yield from visit(child, prefix + child.name + ".", True)

    yield from visit(tree, "", False)


def test_no_public_function_takes_more_than_20_parameters():
    long = []
    for top in PACKAGES + ("scripts",):
        for path in _python_files(top):
            tree = ast.parse(open(path, encoding="utf-8").read())
            long += [f"{os.path.relpath(path, ROOT)}: {name} ({n} parameters)"
                     for name, n in _parameter_counts(tree) if n > MAX_PARAMETERS]
    assert not long, ("public functions with more than 20 parameters (group settings that belong together in a "
                      "documented config dataclass):\n" + "\n".join(long))


def test_the_parameter_count_counts_keyword_only_and_skips_self_and_private_names():
    tree = ast.parse("def f(a, b=1, *args, c, d=2, **kw): pass\n"
                     "def _g(a, b, c): pass\n"
                     "class K:\n    def m(self, x, *, y): pass\n    def __init__(self, p): pass\n"
                     "    def _h(self, q): pass\n")
    assert dict(_parameter_counts(tree)) == {"f": 4, "K.m": 2, "K.__init__": 1}

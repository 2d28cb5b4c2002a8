"""The run files (outer_trainers.runs) and the model training loop (outer_trainers.training) import no
meta-training code: nothing of outer_trainers.steps, .estimators, .learner or .distributed.

Importing `outer_trainers.training.train_loop` normally runs `outer_trainers/__init__.py`, which imports
every subpackage, so the boundary is checked twice without it: statically, over the import graph of
the modules' source (every import statement, function-level ones included, followed through the
other outer_trainers modules they reach), and at run time, in a fresh interpreter where the root
package is an empty stand-in so that only what the modules themselves import gets loaded.
"""
import ast
import os
import subprocess
import sys

import outer_trainers

ROOT = os.path.dirname(os.path.abspath(outer_trainers.__file__))
CHECKED = ("runs", "training")
META_TRAINING = tuple(f"outer_trainers.{name}" for name in ("steps", "estimators", "learner", "distributed"))


def _module_file(module: str):
    """The source file of an outer_trainers module or package, or None if there is none."""
    rel = os.path.join(*module.split(".")[1:]) if "." in module else ""
    for candidate in (os.path.join(ROOT, rel + ".py"), os.path.join(ROOT, rel, "__init__.py")):
        if os.path.isfile(candidate):
            return candidate
    return None


def _module_name(path: str) -> str:
    rel = os.path.relpath(path, ROOT)[:-len(".py")].split(os.sep)
    return ".".join(["outer_trainers"] + [p for p in rel if p != "__init__"])


def _imports(path: str) -> list[tuple[str, int]]:
    """[(outer_trainers module, line)] that the file at `path` imports, anywhere in it."""
    package = _module_name(path) if path.endswith("__init__.py") else _module_name(path).rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            found.append((base, node.lineno))
            found += [(f"{base}.{alias.name}", node.lineno) for alias in node.names
                      if _module_file(f"{base}.{alias.name}")]
    return [(m, line) for m, line in found if m == "outer_trainers" or m.startswith("outer_trainers.")]


def _reachable(start_files: list[str]) -> dict[str, str]:
    """{outer_trainers module: how it is reached} over the import graph from `start_files`, not entering
    the root package's __init__ (which imports everything by design)."""
    seen, todo = {}, [(_module_name(f), f, _module_name(f)) for f in start_files]
    while todo:
        module, path, how = todo.pop()
        if module in seen:
            continue
        seen[module] = how
        for imported, line in _imports(path):
            parts = imported.split(".")
            for target in (".".join(parts[:n]) for n in range(2, len(parts) + 1)):  # importing runs its packages
                target_file = _module_file(target)
                if target_file and target not in seen:
                    todo.append((target, target_file, f"{how} -> {target} (line {line} of {os.path.basename(path)})"))
    return seen


def test_run_files_and_training_loop_import_no_meta_training_code():
    files = sorted(os.path.join(ROOT, sub, name) for sub in CHECKED for name in os.listdir(os.path.join(ROOT, sub))
                   if name.endswith(".py"))
    assert any(f.endswith("train_loop.py") for f in files) and any(f.endswith("checkpoint_manager.py") for f in files)
    reached = _reachable(files)
    bad = {m: how for m, how in reached.items() if m.startswith(META_TRAINING)}
    assert not bad, "run files / the training loop reach meta-training code:\n" + "\n".join(bad.values())
    assert "outer_trainers.training.train_loop" in reached and "outer_trainers.runs.run_checkpoints" in reached


def test_importing_the_training_loop_loads_no_meta_training_module():
    code = f"""
import sys, types
root = types.ModuleType("outer_trainers")
root.__path__ = [{ROOT!r}]
sys.modules["outer_trainers"] = root  # a stand-in: the real __init__ imports every subpackage
import outer_trainers.training.train_loop, outer_trainers.training.train_model, outer_trainers.runs
print("\\n".join(sorted(m for m in sys.modules if m.startswith("outer_trainers."))))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = done.stdout.split()
    assert "outer_trainers.training.train_loop" in loaded and "outer_trainers.runs.checkpoint_manager" in loaded
    assert not [m for m in loaded if m.startswith(META_TRAINING)], loaded

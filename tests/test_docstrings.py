"""Every public definition of lopt, outer_trainers and tasks has a docstring.

Public: module-level classes and functions whose names don't start with "_" in every module of
the three packages, and the public methods and properties those classes define themselves
(an override documented on its base class inherits that docstring, as `inspect.getdoc` does).
"""
import importlib
import inspect
import pkgutil
import re


PACKAGES = ("lopt", "outer_trainers", "tasks")


def _modules():
    for name in PACKAGES:
        pkg = importlib.import_module(name)
        yield pkg
        for info in pkgutil.walk_packages(pkg.__path__, prefix=name + "."):
            yield importlib.import_module(info.name)


def undocumented() -> list[str]:
    """'module.name' (or 'module.Class.method') of every public definition without a docstring."""
    missing = []
    for mod in _modules():
        if not (mod.__doc__ or "").strip():
            missing.append(mod.__name__)
        for name, obj in vars(mod).items():
            if name.startswith("_") or getattr(obj, "__module__", None) != mod.__name__:
                continue
            if not (inspect.isclass(obj) or inspect.isfunction(obj)):
                continue
            if not (inspect.getdoc(obj) or "").strip():
                missing.append(f"{mod.__name__}.{name}")
            if inspect.isclass(obj):
                for attr, member in vars(obj).items():
                    if attr.startswith("_"):
                        continue
                    if isinstance(member, (staticmethod, classmethod)):
                        member = member.__func__
                    if not (inspect.isfunction(member) or isinstance(member, property)):
                        continue
                    if isinstance(member, property):
                        doc = member.__doc__ or next((inspect.getdoc(getattr(b, attr, None)) for b in obj.__mro__[1:]
                                                      if isinstance(getattr(b, attr, None), property)), None)
                    else:
                        doc = inspect.getdoc(getattr(obj, attr))
                    if not (doc or "").strip():
                        missing.append(f"{mod.__name__}.{name}.{attr}")
    return missing


def _constructor_params(cls) -> list[str]:
    """The arguments a user passes to construct `cls` (its own __init__ or dataclass fields)."""
    if "__init__" not in vars(cls):
        return []
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    return [p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and not p.name.startswith("_")]


def undocumented_arguments() -> list[str]:
    """'module.Class: arg, ...' for public classes whose docstring (or __init__'s) does not
    describe every constructor argument in an Args: (or, for dataclasses, Attributes:) section."""
    missing = []
    for mod in _modules():
        for name, obj in vars(mod).items():
            if name.startswith("_") or not inspect.isclass(obj) or obj.__module__ != mod.__name__:
                continue
            params = _constructor_params(obj)
            if not params:
                continue
            doc = (inspect.getdoc(obj) or "") + "\n" + (vars(obj)["__init__"].__doc__ or "")
            section = re.split(r"^\s*(?:Args|Attributes):\s*$", doc, maxsplit=1, flags=re.M)
            body = section[1] if len(section) == 2 else ""
            absent = [p for p in params if not re.search(rf"^\s*{re.escape(p)}\b", body, flags=re.M)]
            if absent:
                missing.append(f"{mod.__name__}.{name}: {', '.join(absent)}")
    return missing


def test_every_public_definition_has_a_docstring():
    missing = undocumented()
    assert not missing, f"{len(missing)} public definitions without a docstring:\n  " + "\n  ".join(missing)


def test_every_constructor_argument_is_documented():
    missing = undocumented_arguments()
    assert not missing, (f"{len(missing)} public classes with undocumented constructor arguments (document them "
                         f"under Args:, one line starting with each name):\n  " + "\n  ".join(missing))

"""lopt/'s package rules: architectures in their own subpackage, lopt/ itself small, and no
function that computes an update reads the platform, a device or the environment."""
import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LOPT = os.path.join(ROOT, "lopt")
# calls that read the platform, a device or the environment
AMBIENT = ("default_backend", "devices", "local_devices", "device_count", "local_device_count", "getenv", "environ")
# where lopt may read them: `pretrained.load` resolves the update layout once, when it builds the
# transform (outside any traced update); lopt.torch runs eagerly in torch and places state on devices
ALLOWED = {os.path.join("lopt", "pretrained", "__init__.py")}


def _lopt_modules():
    for dirpath, dirnames, filenames in os.walk(LOPT):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for name in filenames:
            if name.endswith(".py"):
                yield os.path.relpath(os.path.join(dirpath, name), ROOT)


def test_no_platform_device_or_environment_read_in_jax_updates():
    reads = []
    for rel in _lopt_modules():
        if rel in ALLOWED or rel.startswith(os.path.join("lopt", "torch")):
            continue
        tree = ast.parse(open(os.path.join(ROOT, rel), encoding="utf-8").read())
        for node in ast.walk(tree):
            name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
            if name in AMBIENT:
                reads.append(f"{rel}:{node.lineno} reads {name}")
    assert not reads, "lopt reads the platform, a device or the environment (pass a static option instead):\n" + \
        "\n".join(reads)


def test_the_read_finder_finds_a_read():
    tree = ast.parse("import jax\nx = jax.default_backend()\n")
    assert any(isinstance(n, ast.Attribute) and n.attr in AMBIENT for n in ast.walk(tree))


def test_architectures_have_their_own_subpackage_and_lopt_stays_small():
    """Every registered architecture is defined in lopt/archs (the rule wrapper `RuledLOpt`, registered so
    that its theta files load, in lopt/rules); lopt/ has at most 12 entries at its top."""
    import lopt
    for name in lopt.architectures():
        cls = lopt.architecture(name)
        if cls.__module__.startswith("lopt."):
            allowed = ("lopt.archs.", "lopt.rules.learned") if name == "RuledLOpt" else ("lopt.archs.",)
            assert cls.__module__.startswith(allowed), (name, cls.__module__)
    top = [e for e in os.listdir(LOPT) if e != "__pycache__" and (e.endswith(".py") or
                                                                  os.path.isfile(os.path.join(LOPT, e, "__init__.py")))]
    assert len(top) <= 12, sorted(top)

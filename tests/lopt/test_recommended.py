"""`lopt.pretrained.RECOMMENDED` is the one optimizer every default uses: README's first code block,
`lopt.torch`'s examples and `lopt.torch.hf`'s default source, the benchmark scripts' defaults and the
optax conformance test's recommended cases."""
import inspect
import os
import re
import sys

import pytest

import lopt.pretrained

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_recommended_is_shipped():
    assert lopt.pretrained.RECOMMENDED in lopt.pretrained.names()


def test_readme_first_code_block_and_table_use_it():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    section = readme.split("## Use the recommended optimizer", 1)[1].split("\n## ", 1)[0]
    first_block = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert re.findall(r'lopt\.pretrained\.load\("([^"]+)"', first_block) == [lopt.pretrained.RECOMMENDED]
    torch_block = re.findall(r"```python\n(.*?)```", section, re.S)[1]
    assert re.findall(r'lopt\.torch\.optimizer\("([^"]+)"', torch_block) == [lopt.pretrained.RECOMMENDED]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    assert 1 <= len(rows) <= 3 and rows[0].startswith(f"| `{lopt.pretrained.RECOMMENDED}`"), rows
    assert any(r.startswith("| `normmlp_v3`") for r in rows)


def test_torch_defaults_use_it():
    pytest.importorskip("torch")
    import lopt.torch
    import lopt.torch.hf as hf

    for fn in (hf.optimizers, hf.optimizer_cls_and_kwargs):
        assert inspect.signature(fn).parameters["source"].default == lopt.pretrained.RECOMMENDED
    for doc in (lopt.torch.__doc__, sys.modules["lopt.torch.optimizer"].__doc__):  # the module, not the function
        assert re.search(r'lopt\.torch\.optimizer\("([^"]+)"', doc).group(1) == lopt.pretrained.RECOMMENDED


def test_benchmark_script_defaults_use_it():
    import benchmark_lm_scale  # scripts/ is on sys.path via tests/conftest.py
    import benchmark_optimizers

    assert benchmark_lm_scale.DEFAULT_OPTIMIZERS[1] == f"pretrained:{lopt.pretrained.RECOMMENDED}"
    assert benchmark_optimizers.SHIPPED[0] == lopt.pretrained.RECOMMENDED
    pytest.importorskip("torch")
    import benchmark_torch

    assert benchmark_torch.SHIPPED[0] == lopt.pretrained.RECOMMENDED


def test_the_conformance_test_recommends_it():
    from tests.lopt import test_optax_conformance

    assert test_optax_conformance.RECOMMENDED[0] == f"pretrained:{lopt.pretrained.RECOMMENDED}"

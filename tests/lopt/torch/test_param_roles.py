"""lopt.torch.param_roles: roles and layouts read from modules (Embedding, Linear, Conv1d/2d, HF Conv1D,
LayerNorm, tied weights), the shape-only warning and strict_roles, and optimizers built from a module."""
from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch", reason='PyTorch is not installed: pip install -e ".[torch]"')

import lopt.torch as lt  # noqa: E402
from lopt.torch.param_roles import RoleFromShapeWarning, module_roles  # noqa: E402
from tests.fixtures import single_torch_thread  # noqa: E402

one_torch_thread = pytest.fixture(autouse=True)(single_torch_thread)


def read(model, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a module of known kinds reads without a warning
        roles = module_roles(model, **kw)
    return {i.name: (i.role, i.layout) for i in roles.info.values()}


class Tied(torch.nn.Module):
    """A token table tied to the output head (as GPT-2's wte and lm_head), a conv stack and a norm."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv1d(3, 4, 3)
        self.conv2 = torch.nn.Conv2d(4, 5, (2, 3))
        self.norm = torch.nn.LayerNorm(5)
        self.head = torch.nn.Linear(6, 7, bias=False)
        self.embed = torch.nn.Embedding(7, 6)
        self.head.weight = self.embed.weight


def test_roles_and_layouts_per_module_kind():
    assert read(Tied()) == {
        "conv1.weight": ("matrix", "torch"), "conv1.bias": ("vector", "torch"),
        "conv2.weight": ("matrix", "torch"), "conv2.bias": ("vector", "torch"),
        "norm.weight": ("vector", "torch"), "norm.bias": ("vector", "torch"),
        "head.weight": ("embedding", "jax"),  # tied: read once, as the table it is
    }
    assert len(module_roles(Tied()).info) == 7  # 8 module parameters, the tied one once
    conv_t = read(torch.nn.ConvTranspose2d(2, 3, (4, 5)))
    assert conv_t["weight"] == ("matrix", (2, 3, 0, 1))


def test_hf_conv1d_is_a_matrix_stored_in_out():
    pytorch_utils = pytest.importorskip("transformers.pytorch_utils")
    assert read(pytorch_utils.Conv1D(5, 3)) == {"weight": ("matrix", "jax"), "bias": ("vector", "torch")}


def test_shape_only_roles_warn_once_naming_them_and_strict_raises():
    class Custom(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.table = torch.nn.Parameter(torch.zeros(4, 3))
            self.gain = torch.nn.Parameter(torch.ones(3))  # 1-D: a vector whatever holds it, no warning

    custom = Custom()
    with pytest.warns(RoleFromShapeWarning, match=r"1 parameter\(s\).*: table\. ") as record:
        roles = module_roles(custom)
    assert len(record) == 1 and record[0].filename == __file__
    assert (roles.role(custom.table), roles.layout(custom.table)) == ("matrix", "torch")
    assert (roles.role(custom.gain), roles.from_shape()) == ("vector", ["table"])
    with pytest.raises(ValueError, match="table.*strict_roles=True"):
        module_roles(Custom(), strict_roles=True)
    with pytest.raises(ValueError, match="strict_roles"):
        lt.optimizer("celo2_v5", Custom(), num_steps=10, strict_roles=True)


def test_named_parameters_read_names():
    model = torch.nn.ModuleDict({"wte": torch.nn.Embedding(5, 4), "ln_f": torch.nn.LayerNorm(4),
                                 "proj": torch.nn.Linear(4, 4)})
    with pytest.warns(RoleFromShapeWarning, match="proj.weight"):
        roles = module_roles(model.named_parameters())
    got = {i.name: (i.role, i.reason) for i in roles.info.values()}
    assert got["wte.weight"] == ("embedding", "name") and got["ln_f.weight"][0] == "vector"
    assert got["proj.weight"] == ("matrix", "shape") and got["proj.bias"][0] == "vector"


def test_optimizer_from_a_module_steps_hf_conv1d_as_the_transposed_linear():
    """The same layer stored [in, out] (HF Conv1D) and [out, in] (nn.Linear) takes the same Celo2 step,
    transposed: the role and layout come from the module. Read from its shape, the Conv1D weight
    would be a [6, 3] matrix with fan_in 6 and get another width scale (1 instead of √2)."""
    pytorch_utils = pytest.importorskip("transformers.pytorch_utils")
    torch.manual_seed(0)
    x = torch.randn(8, 3)

    def stepped(model, params):
        opt = lt.optimizer("celo2_v5", params, num_steps=20)
        before = model[0].weight.detach().clone()
        loss = model(x).square().mean()
        loss.backward()
        opt.step(loss=loss)
        return opt, model[0].weight.detach() - before

    lin = torch.nn.Sequential(torch.nn.Linear(3, 6))
    steps = {}
    for how in ("module", "shape"):
        conv = torch.nn.Sequential(pytorch_utils.Conv1D(6, 3))
        with torch.no_grad():
            conv[0].weight.copy_(lin[0].weight.t())
            conv[0].bias.copy_(lin[0].bias)
        opt, steps[how] = stepped(conv, conv if how == "module" else conv.parameters())
        if how == "module":
            assert opt.state[conv[0].weight]["axes"] == (0, 1) and opt.state[conv[0].weight]["role"] == "matrix"
    opt, step_lin = stepped(lin, lin)
    assert opt.state[lin[0].weight]["axes"] == (1, 0) and step_lin.abs().max() > 1e-4
    torch.testing.assert_close(steps["module"], step_lin.t(), atol=1e-6, rtol=1e-4)
    ratio = (steps["shape"].norm() / step_lin.norm()).item()
    assert abs(ratio - 2 ** -0.5) < 0.05, ratio


def test_optimizer_from_a_module_reads_embeddings_as_tables():
    """An nn.Embedding's table takes Celo2's AdamW path (not orthogonalized): its update differs
    from the one the same tensor gets when read as a matrix from its shape."""
    def stepped(model_or_params):
        torch.manual_seed(0)
        emb = torch.nn.Embedding(6, 4)
        opt = lt.optimizer("celo2_v5", emb if model_or_params == "module" else emb.parameters(), num_steps=20)
        before = emb.weight.detach().clone()
        emb(torch.tensor([0, 2, 3])).square().sum().backward()
        opt.step(loss=1.0)
        return opt.state[emb.weight]["role"], emb.weight.detach() - before

    role_m, step_m = stepped("module")
    role_s, step_s = stepped("params")
    assert (role_m, role_s) == ("embedding", "matrix")
    assert step_m[1].abs().max() == 0  # rows not looked up have zero gradient and a zero Adam step
    assert step_s[1].abs().max() > 0  # orthogonalized, the step spreads over every row

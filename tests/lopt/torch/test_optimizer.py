"""lopt.torch as a torch optimizer: training, state_dict resumes, parameter groups, layouts, errors.

(The update's parity with the JAX transform is tests/lopt/test_torch.py's.)
"""
from __future__ import annotations

import copy
import io
import subprocess
import sys

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason='PyTorch is not installed: pip install -e ".[torch]"')

import lopt  # noqa: E402
import lopt.torch as lt  # noqa: E402
from tests.fixtures import torch_architectures, single_torch_thread


one_torch_thread = pytest.fixture(autouse=True)(single_torch_thread)


def digits():
    from sklearn.datasets import load_digits
    x, y = load_digits(return_X_y=True)
    return torch.tensor(x / 16.0, dtype=torch.float32), torch.tensor(y)


def mlp(seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Tanh(), torch.nn.Linear(32, 10)).to(dtype)


def train(model, opt, steps, x, y, batch=128, start=0):
    """Minibatch steps start .. start + steps − 1 (batch i is fixed by i), their losses."""
    losses = []
    for i in range(start, start + steps):
        idx = torch.from_numpy(np.random.RandomState(i).choice(len(x), batch, replace=False))

        def closure():
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x[idx].to(model[0].weight.dtype)), y[idx])
            loss.backward()
            return loss

        losses.append(float(opt.step(closure).detach()))
    return losses


def random_source(name):
    lo = lopt.base.architecture(name)()
    return lo, lo.init(jax.random.key(0))


def saved_and_restored(model, opt):
    """torch.save of the model's and optimizer's state dicts, loaded back with torch.load's defaults,
    and a fresh model (another init) holding the saved weights: (saved dict, restored model)."""
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
    buf.seek(0)
    saved = torch.load(buf)
    restored = mlp(seed=1)
    restored.load_state_dict(saved["model"])
    return saved, restored


def test_every_architecture_has_a_torch_rule():
    assert lt.supported_architectures() == torch_architectures()


def test_import_lopt_does_not_import_torch():
    code = "import sys, lopt; assert 'torch' not in sys.modules, 'lopt imported torch'"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("name", lopt.pretrained.names())
def test_shipped_optimizer_trains_a_torch_mlp_on_digits(name):
    x, y = digits()
    model = mlp()
    opt = lt.optimizer(name, model.parameters(), num_steps=300)
    losses = train(model, opt, 300, x, y)
    start, end = np.mean(losses[:5]), np.mean(losses[-20:])
    assert np.isfinite(losses).all() and end < 0.25 * start, (start, end)


@pytest.mark.parametrize("name", torch_architectures() + ["normmlp_v3"])
def test_state_dict_round_trip_resumes_bit_identically(name):
    """50 steps, state_dict through torch.save, a fresh model and optimizer loaded, 50 more: the
    same parameters, bit for bit, as 100 steps without the interruption."""
    x, y = digits()
    source = name if name in lopt.pretrained.names() else random_source(name)
    model = mlp()
    opt = lt.optimizer(source, model.parameters(), num_steps=100)
    train(model, opt, 100, x, y)

    first = mlp()
    opt1 = lt.optimizer(source, first.parameters(), num_steps=100)
    train(first, opt1, 50, x, y)
    saved, resumed = saved_and_restored(first, opt1)
    opt2 = lt.optimizer(source, resumed.parameters(), num_steps=100)
    opt2.load_state_dict(saved["opt"])
    train(resumed, opt2, 50, x, y, start=50)
    for a, b in zip(model.parameters(), resumed.parameters()):
        assert torch.equal(a, b)


def test_loaded_state_is_a_copy_and_keeps_its_dtypes():
    """bfloat16 parameters keep float32 state through load_state_dict (torch's default would cast
    it to bfloat16), and the loaded optimizer shares no tensor with the dict it was given."""
    x, y = digits()
    model = mlp(dtype=torch.bfloat16)
    opt = lt.optimizer("normmlp_v3", model.parameters(), num_steps=20)
    train(model, opt, 3, x, y)
    sd = opt.state_dict()
    other = lt.optimizer("normmlp_v3", copy.deepcopy(model).parameters(), num_steps=20)
    other.load_state_dict(sd)
    st = next(iter(other.state.values()))
    assert st["momenta"].dtype == torch.float32 and st["step"].dtype == torch.int64 and int(st["step"]) == 3
    orig = next(iter(opt.state.values()))
    assert st["momenta"].data_ptr() != orig["momenta"].data_ptr()
    assert model[0].weight.dtype == torch.bfloat16


def test_param_groups_take_their_own_options():
    """lr multiplies a group's update (0 freezes it), num_steps is per group (a group with its own
    horizon steps as an optimizer built with it), parameters without a gradient are skipped."""
    x, y = digits()
    ref = mlp()
    opt_ref = lt.optimizer("normmlp_v3", ref[0].parameters(), num_steps=300)
    model = mlp()
    opt = lt.optimizer("normmlp_v3", [{"params": model[0].parameters(), "num_steps": 300},
                                      {"params": model[2].parameters(), "lr": 0.0}], num_steps=100)
    frozen = model[2].weight.detach().clone()
    for i in range(5):
        idx = torch.arange(i * 100, i * 100 + 100)
        for m, o in ((ref, opt_ref), (model, opt)):
            o.zero_grad()
            loss = torch.nn.functional.cross_entropy(m(x[idx]), y[idx])
            loss.backward()
            o.step(loss=loss)
    assert torch.equal(model[2].weight, frozen)
    for a, b in zip(ref[0].parameters(), model[0].parameters()):  # the same grads (frozen head in both)
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-8)  # rounding: the step-size MLP's GEMM has more rows
    assert int(opt.state[model[2].weight]["step"]) == 5

    half = mlp()
    opt_half = lt.optimizer("normmlp_v3", [{"params": [half[2].bias], "lr": 0.5}], num_steps=100)
    full = mlp()
    opt_full = lt.optimizer("normmlp_v3", [full[2].bias], num_steps=100)
    for m, o in ((half, opt_half), (full, opt_full)):
        loss = torch.nn.functional.cross_entropy(m(x[:100]), y[:100])
        loss.backward()
        o.step(loss=loss)
    b0 = mlp()[2].bias.detach()
    torch.testing.assert_close(half[2].bias - b0, 0.5 * (full[2].bias - b0), rtol=1e-5, atol=1e-7)  # p + u rounds
    assert half[2].weight.grad is not None and not opt_half.state.get(half[2].weight)


def test_torch_lr_schedulers_scale_the_update():
    model = mlp()
    opt = lt.optimizer("normmlp_v3", model.parameters(), num_steps=10)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.0)
    w0 = model[0].weight.detach().clone()
    x, y = digits()
    train(model, opt, 1, x, y)
    sched.step()
    assert torch.equal(model[0].weight, w0) and opt.param_groups[0]["lr"] == 0.0


def test_add_param_group_later_and_add_more_steps():
    x, y = digits()
    model = mlp()
    opt = lt.optimizer("normmlp_v3", model[0].parameters(), num_steps=10)
    train(model, opt, 2, x, y)
    opt.add_param_group({"params": model[2].parameters()})
    train(model, opt, 2, x, y, start=2)
    assert int(opt.state[model[0].weight]["step"]) == 4 and int(opt.state[model[2].weight]["step"]) == 2


def test_theta_file_source_equals_pair(tmp_path):
    lo, theta = random_source("MLPLOpt")
    path = str(tmp_path / "theta.msgpack")
    lopt.save_theta(path, lo, theta)
    x, y = digits()
    a, b = mlp(), mlp()
    train(a, lt.optimizer(path, a.parameters()), 3, x, y)
    train(b, lt.optimizer((lo, theta), b.parameters()), 3, x, y)
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)


def test_layouts_per_group_per_parameter_and_callable_are_resolved_and_picklable():
    lo, theta = random_source("AdafacMLPLOpt")
    emb = torch.nn.Embedding(11, 6)
    conv_t = torch.nn.ConvTranspose2d(3, 4, (2, 3))
    lin = torch.nn.Linear(6, 5)
    opt = lt.optimizer((lo, theta), [
        {"params": [emb.weight], "layout": "jax"},
        {"params": [conv_t.weight, conv_t.bias], "layout": [(2, 3, 0, 1), "torch"]},
        {"params": lin.parameters(), "layout": lambda p: "torch"}])
    assert opt.param_groups[2]["layout"] == [(1, 0), (0,)]
    for p in [emb.weight, conv_t.weight, conv_t.bias, *lin.parameters()]:
        p.grad = torch.randn_like(p)
    opt.step()
    assert opt.state[emb.weight]["fac_row"].shape == (3, 11)       # rows of [11, 6], as flax's Embed
    assert opt.state[conv_t.weight]["fac_row"].shape == (3, 2, 3, 3)  # [kh, kw, in] of [in=3, out=4, kh=2, kw=3]
    assert opt.state[lin.weight]["fac_col"].shape == (3, 5)        # the outputs of [out=5, in=6]
    torch.save(opt.state_dict(), io.BytesIO())


def test_float64_and_bfloat16_parameters():
    x, y = digits()
    for dtype, state_dtype in ((torch.float64, torch.float64), (torch.bfloat16, torch.float32)):
        model = mlp(dtype=dtype)
        opt = lt.optimizer("normmlp_v3", model.parameters(), num_steps=50)
        losses = train(model, opt, 50, x, y)
        assert losses[-1] < losses[0] and model[0].weight.dtype == dtype
        assert opt.state[model[0].weight]["momenta"].dtype == state_dtype


def test_errors_say_what_was_wrong():
    params = list(mlp().parameters())
    with pytest.raises(ValueError, match="unknown pretrained optimizer 'nope'.*normmlp_v3"):
        lt.optimizer("nope", params, num_steps=10)
    with pytest.raises(ValueError, match="pass num_steps"):
        lt.optimizer("normmlp_v3", params)
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="positive int"):
            lt.optimizer("normmlp_v3", params, num_steps=bad)
    with pytest.warns(UserWarning, match="outside them"):
        lt.optimizer("normmlp_v3", params, num_steps=100000)
    with pytest.raises(TypeError, match="unknown option"):
        lt.optimizer("normmlp_v3", params, num_steps=10, momentum=0.9)
    with pytest.raises(TypeError, match="unknown option"):
        lt.optimizer("normmlp_v3", [{"params": params, "num_step": 10}], num_steps=10)
    with pytest.raises(ValueError, match="unknown layout"):
        lt.optimizer("normmlp_v3", params, num_steps=10, layout="flax")
    with pytest.raises(ValueError, match="not a permutation"):
        lt.optimizer("normmlp_v3", params, num_steps=10, layout=(1, 0))  # the biases are 1-D
    with pytest.raises(TypeError, match="source must be"):
        lt.optimizer(42, params)
    with pytest.raises(ValueError, match="does not match the structure"):
        lt.optimizer((lopt.MLPLOpt(), lopt.MLPLOpt(hidden_size=4).init(jax.random.key(0))), params)

    opt = lt.optimizer("normmlp_v3", params, num_steps=10)
    for p in params:
        p.grad = torch.ones_like(p)
    with pytest.raises(ValueError, match="reads the training loss.*step\\(closure\\)"):
        opt.step()
    with pytest.raises(ValueError, match="not both"):
        opt.step(lambda: 1.0, loss=1.0)
    assert all(not s for s in opt.state.values())  # a refused step changed nothing
    lt.optimizer("normmlp_v3", params, num_steps=10, require_loss=False).step()  # opted out: zero loss features


def test_load_state_dict_refuses_another_optimizer():
    model = mlp()
    opt = lt.optimizer("normmlp_v3", model.parameters(), num_steps=10)
    adam = torch.optim.Adam(model.parameters())
    with pytest.raises(ValueError, match="not written by a lopt.torch optimizer"):
        opt.load_state_dict(adam.state_dict())
    v2 = lt.optimizer("normmlp_v2", model.parameters(), num_steps=10)
    with pytest.raises(ValueError, match="written by NormMLPLOpt"):
        opt.load_state_dict(v2.state_dict())
    lo, theta = lopt.pretrained.deployed_learned_optimizer("normmlp_v3")
    other = lt.optimizer((lo, jax.tree_util.tree_map(lambda t: t * 1.01, theta)), model.parameters(), num_steps=10)
    with pytest.raises(ValueError, match="another theta"):
        opt.load_state_dict(other.state_dict())
    as_trained = lt.optimizer(lopt.pretrained.load_learned_optimizer_by_name("normmlp_v3"), model.parameters(),
                              num_steps=10)  # without the deploy options (the overshoot brake): another config
    with pytest.raises(ValueError, match="written by NormMLPLOpt"):
        opt.load_state_dict(as_trained.state_dict())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("name", ["normmlp_v3", "AdafacMLPLOpt", "HyperLOpt", "Celo2LOpt"])
def test_cuda_matches_cpu(name):
    source = name if name in lopt.pretrained.names() else random_source(name)
    x, y = digits()
    cpu, gpu = mlp(), mlp().cuda()
    train(cpu, lt.optimizer(source, cpu.parameters(), num_steps=20), 20, x, y)
    train(gpu, lt.optimizer(source, gpu.parameters(), num_steps=20), 20, x.cuda(), y.cuda())
    for a, b in zip(cpu.parameters(), gpu.parameters()):
        torch.testing.assert_close(b.cpu(), a, rtol=1e-4, atol=1e-5)


BRAKED = {"NormMLPLOpt": lopt.NormMLPLOpt(overshoot_gain=1.0, overshoot_threshold=0.0, base_lr=0.1),
          "Celo2LOpt": lopt.Celo2LOpt(overshoot_gain=1.0, overshoot_threshold=0.0, matrix_lr=0.5, adam_lr=0.1)}


@pytest.mark.parametrize("name", sorted(BRAKED))
def test_overshoot_brake_state_round_trips_and_is_global(name):
    """The brake's state (per parameter "prev_update", float32; log α once per optimizer, under
    state["overshoot_brake"]) resumes bit-identically through torch.save while the brake is engaged,
    and log α is one value for every parameter group. (Step sizes that overshoot: log α ≈ −0.65 for
    Celo2LOpt after 30 steps.)"""
    x, y = digits()
    lo = BRAKED[name]
    source = (lo, lo.init(jax.random.key(0)))
    model = mlp()
    opt = lt.optimizer(source, [{"params": model[0].parameters()}, {"params": model[2].parameters(), "lr": 0.5}],
                       num_steps=60)
    train(model, opt, 60, x, y)

    first = mlp()
    opt1 = lt.optimizer(source, [{"params": first[0].parameters()}, {"params": first[2].parameters(), "lr": 0.5}],
                        num_steps=60)
    train(first, opt1, 30, x, y)
    assert float(opt1.state["overshoot_brake"]["log_brake"]) < 0, "the brake did not engage: the test would be empty"
    assert opt1.state[first[2].bias]["prev_update"].dtype == torch.float32
    saved, resumed = saved_and_restored(first, opt1)
    opt2 = lt.optimizer(source, [{"params": resumed[0].parameters()}, {"params": resumed[2].parameters(), "lr": 0.5}],
                        num_steps=60)
    opt2.load_state_dict(saved["opt"])
    assert opt2.state["overshoot_brake"]["log_brake"] is not saved["opt"]["state"]["overshoot_brake"]["log_brake"]
    train(resumed, opt2, 30, x, y, start=30)
    for a, b in zip(model.parameters(), resumed.parameters()):
        assert torch.equal(a, b)
    assert torch.equal(opt.state["overshoot_brake"]["log_brake"], opt2.state["overshoot_brake"]["log_brake"])


def test_role_option_is_checked():
    emb = torch.nn.Embedding(11, 6)
    opt = lt.optimizer("normmlp_v3", [{"params": emb.parameters(), "role": "embedding"}], num_steps=10)
    emb(torch.arange(4)).sum().backward()
    opt.step(loss=1.0)
    assert opt.state[emb.weight]["role"] == "embedding"
    with pytest.raises(ValueError, match="unknown parameter role"):
        lt.optimizer("normmlp_v3", emb.parameters(), num_steps=10, role="table")
    with pytest.raises(ValueError, match="fewer than 2 axes"):
        lt.optimizer("normmlp_v3", torch.nn.Linear(3, 2).parameters(), num_steps=10, role="matrix")
    with pytest.raises(ValueError, match="no fan-in rule"):
        lt.optimizer(random_source("MLPLOpt"), emb.parameters(), role="embedding")


# max |p_bf16 − p_f32| / max |p_f32 − p_0| after MOMENTA_STEPS digits steps: measured 3.4e-3 (normmlp_v3) and
# 3.1e-2 (celo2_v5, whose Newton–Schulz step amplifies the difference)
MOMENTA_STEPS, MOMENTA_TOL = 200, {"normmlp_v3": 1e-2, "celo2_v5": 6e-2}


@pytest.mark.parametrize("name", ["normmlp_v3", "celo2_v5"])
def test_bfloat16_momenta_stay_near_float32_and_resume_bit_identically(name):
    """momentum_dtype=torch.bfloat16 keeps the momenta in bfloat16 (their bytes halved) and trains
    within MOMENTA_TOL of float32 momenta (relative to the distance travelled: the bound
    `TorchLearnedOptimizer` documents); 20 steps, torch.save, 20 more resume bit for bit."""
    x, y = digits()
    full, low = mlp(), mlp()
    train(full, lt.optimizer(name, full.parameters(), num_steps=MOMENTA_STEPS), MOMENTA_STEPS, x, y)
    opt = lt.optimizer(name, low.parameters(), num_steps=MOMENTA_STEPS, momentum_dtype=torch.bfloat16)
    train(low, opt, MOMENTA_STEPS, x, y)
    assert opt.state[low[0].weight]["momenta"].dtype == torch.bfloat16
    assert opt.state[low[0].weight]["second_moment"].dtype == torch.float32
    travel = max(float((a - b).abs().max()) for a, b in zip(full.parameters(), mlp().parameters()))
    diff = max(float((a - b).abs().max()) for a, b in zip(full.parameters(), low.parameters()))
    assert 0 < diff <= MOMENTA_TOL[name] * travel, (diff, travel)

    straight, first = mlp(), mlp()
    train(straight, lt.optimizer(name, straight.parameters(), num_steps=40, momentum_dtype=torch.bfloat16), 40, x, y)
    opt1 = lt.optimizer(name, first.parameters(), num_steps=40, momentum_dtype=torch.bfloat16)
    train(first, opt1, 20, x, y)
    saved, resumed = saved_and_restored(first, opt1)
    opt2 = lt.optimizer(name, resumed.parameters(), num_steps=40, momentum_dtype=torch.bfloat16)
    opt2.load_state_dict(saved["opt"])
    assert opt2.state[resumed[0].weight]["momenta"].dtype == torch.bfloat16
    train(resumed, opt2, 20, x, y, start=20)
    for a, b in zip(straight.parameters(), resumed.parameters()):
        assert torch.equal(a, b)


def test_momentum_dtype_is_checked():
    params = list(mlp().parameters())
    with pytest.raises(ValueError, match="floating-point torch.dtype"):
        lt.optimizer("normmlp_v3", params, num_steps=10, momentum_dtype="bfloat16")
    with pytest.raises(ValueError, match="keeps no flat momenta.*NormMLPLOpt"):
        lt.optimizer(random_source("AdafacMLPLOpt"), params, momentum_dtype=torch.bfloat16)

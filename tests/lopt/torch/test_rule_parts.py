"""lopt.torch.rules' parts, one to one with lopt.rules': the same rule around torch's SGD and around
optax.sgd moves a dense layer, a bias and a conv kernel to the same parameters (≤ 1e-6 relative)."""
import pytest

torch = pytest.importorskip("torch", reason='PyTorch is not installed: pip install -e ".[torch]"')

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import lopt.rules  # noqa: E402
from lopt.rules import overshoot_brake as jax_brake  # noqa: E402
from lopt.torch.layout import to_jax  # noqa: E402
from lopt.torch.rules import conv_step, depth, horizon, overshoot_brake, radial, schedule, weight_decay  # noqa: E402

LR, N, STEPS = 0.05, 20, 6
LOSSES = [1.0, 0.6, 0.3, 0.1, 0.05, 0.02]


def torch_params(scale=6.0, conv=True):  # the dense kernel at rms · √fan_in ≈ 6 > 4
    gen = torch.Generator().manual_seed(0)
    ps = {"Dense_0/kernel": torch.randn(8, 8, generator=gen) * scale / 8 ** 0.5, "Dense_0/bias": torch.zeros(8)}
    if conv:
        ps["Conv_0/kernel"] = torch.randn(4, 1, 3, 3, generator=gen) / 3.0
    return {k: torch.nn.Parameter(v) for k, v in ps.items()}


def as_jax(ps):
    tree = {}
    for name, p in ps.items():
        module, leaf = name.split("/")
        tree.setdefault(module, {})[leaf] = jnp.asarray(to_jax(p.detach()))
    return tree


def grad(p, i, pull):
    """The gradient at step i, elementwise (so the same in either layout): its sign flips from step to
    step (the brake acts), and `pull` · p pulls the weights outwards (the growth limit acts)."""
    cos = torch.cos if isinstance(p, torch.Tensor) else jnp.cos
    return (-1) ** i * cos(3.0 * p + i) - pull * p


def run_torch(make, ps, losses=LOSSES, pull=0.5):
    opt = make(torch.optim.SGD(list(ps.values()), lr=LR))
    for i, loss in enumerate(losses):
        for p in ps.values():
            p.grad = grad(p.detach(), i, pull)
        opt.step(loss=loss)
    return as_jax(ps)


def run_jax(tx, params, losses=LOSSES, pull=0.5):
    state = tx.init(params)
    for i, loss in enumerate(losses):
        g = jax.tree_util.tree_map(lambda p: grad(p, i, pull), params)
        u, state = tx.update(g, state, params, loss=jnp.float32(loss))
        params = optax.apply_updates(params, u)
    return params


CASES = {
    "scheduled": (lambda o: schedule.scheduled(o, N), lambda t: lopt.rules.scheduled(t, N)),
    "horizon_scaled": (lambda o: horizon.horizon_scaled(o, 80, 20), lambda t: lopt.rules.horizon_scaled(t, 80, 20)),
    "depth_scaled": (lambda o: depth.depth_scaled(o, 1), lambda t: lopt.rules.depth_scaled(t, 1)),
    "conv_step_scaled": (lambda o: conv_step.conv_step_scaled(o, 3.0), lambda t: lopt.rules.conv_step_scaled(t, 3.0)),
    "growth_limited": (lambda o: radial.growth_limited(o, 4.0), lambda t: lopt.rules.growth_limited(t, 4.0)),
    "loss_aware_decay": (lambda o: weight_decay.loss_aware_decay(o, LR, 0.3, loss_free=3.0),
                         lambda t: lopt.rules.loss_aware_decay(t, LR, 0.3, loss_free=3.0)),
    "overshoot_brake": (lambda o: overshoot_brake.overshoot_brake(o, 0.5),
                        lambda t: jax_brake.overshoot_brake(t, 0.5)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_torch_part_moves_the_parameters_as_its_jax_part(name):
    make_torch, make_jax = CASES[name]
    ps = torch_params()
    start = as_jax(ps)
    pull = 0.0 if name == "overshoot_brake" else 0.5
    got, want = run_torch(make_torch, ps, pull=pull), run_jax(make_jax(optax.sgd(LR)), start, pull=pull)
    plain = run_jax(optax.sgd(LR), start, pull=pull)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), got, want)
    moved = jax.tree_util.tree_map(lambda a, b: float(jnp.max(jnp.abs(a - b))), want, plain)
    assert max(jax.tree_util.tree_leaves(moved)) > 1e-4, f"{name} changed nothing here: {moved}"


def test_a_torch_part_round_trips_its_state():
    ps = torch_params()
    opt = weight_decay.loss_aware_decay(torch.optim.SGD(list(ps.values()), lr=LR), LR, 0.3, loss_free=3.0)
    for p in ps.values():
        p.grad = torch.ones_like(p)
    opt.step(loss=1.0)
    opt.step(loss=0.1)
    other = weight_decay.loss_aware_decay(torch.optim.SGD(list(ps.values()), lr=LR), LR, 0.3, loss_free=3.0)
    other.load_state_dict(opt.state_dict())
    assert other.count == 2 and torch.equal(other.loss_state, opt.loss_state)
    assert torch.equal(other.loss_start, torch.tensor(1.0))

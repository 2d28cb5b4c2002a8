"""lopt.torch runs the published optimizers (`lopt.published`): the authors' reference steps, by name.

`lt.optimizer("celo", params, num_steps=N)` loads `lopt.published.learned_optimizer("celo")`; fed
the inputs of tests/lopt/data/reference_{celo,celo_adam}.npz (the authors' own loop, 25 steps, N =
100 and 2000; see tests/lopt/test_published.py), every leaf after every step matches the authors'
parameters to 1e-5 of the leaf's scale, as the JAX transform does. The loss features of the
learned scheduler amplify rounding (`lopt.torch.parts.learned_scheduler`): a negative control
shows that computing them in float64 leaves that bound (Celo, N = 2000).
"""
from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason='PyTorch is not installed: pip install -e ".[torch]"')

import lopt  # noqa: E402
import lopt.published  # noqa: E402
import lopt.torch as lt  # noqa: E402
from lopt.torch.parts import learned_scheduler  # noqa: E402
from tests.fixtures import single_torch_thread  # noqa: E402

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")
LEAVES = ("conv/kernel", "dense0/bias", "dense0/kernel", "dense1/bias", "dense1/kernel")
STEPS, RTOL = 25, 1e-5

one_torch_thread = pytest.fixture(autouse=True)(single_torch_thread)


def authors_errors(name, num_steps):
    """The largest error of every step against the authors' loop, max |ours − theirs| / max |theirs| per leaf."""
    ref = np.load(os.path.join(DATA, f"reference_{name}.npz"))
    params = {k: torch.nn.Parameter(torch.tensor(ref[f"params_init/{k}"])) for k in LEAVES}  # JAX layout
    opt = lt.optimizer(name, list(params.values()), num_steps=num_steps, layout="jax")
    errs = []
    for t in range(STEPS):
        for k, p in params.items():
            p.grad = torch.tensor(ref[f"grads/{t}/{k}"])
        opt.step(loss=float(ref["losses"][t]))
        theirs = {k: ref[f"params/{num_steps}/{t}/{k}"] for k in LEAVES}
        errs.append(max(float(np.max(np.abs(params[k].detach().numpy() - v)) / np.max(np.abs(v)))
                        for k, v in theirs.items()))
    moved = max(float(np.max(np.abs(params[k].detach().numpy() - ref[f"params_init/{k}"])) / np.max(np.abs(v)))
                for k, v in theirs.items())
    return max(errs), moved


@pytest.mark.parametrize("name", ["celo", "celo_adam"])
def test_every_step_matches_the_authors_loop_in_torch(name):
    for num_steps in (100, 2000):
        worst, moved = authors_errors(name, num_steps)
        assert worst <= RTOL and moved > 1000 * RTOL, (name, num_steps, worst, moved)


def test_float64_loss_features_are_not_the_authors(monkeypatch):
    """A negative control: the scheduler's loss averages and features computed in float64 (then
    rounded) are further from the authors' float32 values than the tolerance: Celo at N = 2000."""
    step = learned_scheduler._loss_step

    def in_float64(means, running_min, decays, count, loss):
        out = step(means.double(), running_min.double(), decays.double(), count.double(), loss.double())
        return tuple(x.to(means.dtype) for x in out)

    monkeypatch.setattr(learned_scheduler, "_loss_step", in_float64)
    worst, _ = authors_errors("celo", 2000)
    assert worst > 3 * RTOL, worst


def test_published_names_load_and_refuse_what_they_cannot_run():
    assert lopt.published.names() == ["celo", "celo_adam"]
    w = torch.nn.Parameter(torch.ones(3, 2))
    opt = lt.optimizer("celo_adam", [w], num_steps=10)
    lo, theta = lopt.published.learned_optimizer("celo_adam")
    assert opt.source.learned_opt == lo and opt.source.label == "celo_adam"
    np.testing.assert_array_equal(opt.source.theta["scheduler"]["embed"]["w"],
                                  np.asarray(theta["scheduler"]["embed"]["w"]))
    with pytest.raises(ValueError, match="schedules its step size by training progress"):
        lt.optimizer("celo", [w])
    w.grad = torch.ones(3, 2)
    with pytest.raises(ValueError, match="reads the training loss"):
        opt.step()
    with pytest.raises(ValueError, match="reads the training loss"):
        lt.optimizer("celo", [w], num_steps=10, require_loss=False).step()

"""The weight-decay rule (lopt.rules.weight_decay) in Celo2LOpt: its math by role, its learned λ's
meta-gradient, that it is off by default, and fine-tuning a shipped theta with it on."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lopt
from lopt import param_roles
from lopt.rules import weight_decay as wd_rule
from outer_trainers.learner.meta_training_run import load_theta_init

RNG = np.random.RandomState(0)
# a dense kernel (orthogonalized, η_matrix), a one-output head kernel (a matrix on the NAdamW path, η_adam),
# a bias and an embedding
PARAMS = {"dense": {"kernel": RNG.randn(4, 3).astype(np.float32), "bias": RNG.randn(3).astype(np.float32)},
          "head": {"kernel": RNG.randn(3, 1).astype(np.float32)},
          "embed": {"embedding": RNG.randn(5, 2).astype(np.float32)}}
GRADS = jax.tree_util.tree_map(lambda p: RNG.randn(*p.shape).astype(np.float32), PARAMS)
# the step sizes of a fresh theta at t = 0 (constant schedule, no horizon or depth rule): matrix_lr, adam_lr
ETA = {("dense", "kernel"): 0.02, ("head", "kernel"): 3e-3, ("dense", "bias"): 3e-3, ("embed", "embedding"): 3e-3}
ROLES = {("dense", "kernel"): "matrix", ("head", "kernel"): "matrix", ("dense", "bias"): "vector",
         ("embed", "embedding"): "embedding"}


def first_update(learned_opt, theta):
    tx = learned_opt.opt_fn(theta)
    updates, _ = tx.update(GRADS, tx.init(PARAMS), PARAMS, loss=1.0)
    return {k: np.asarray(updates[k[0]][k[1]], np.float64) for k in ETA}


def theta_without_decay(theta):
    return {k: v for k, v in theta.items() if k != wd_rule.THETA_KEY}


@pytest.fixture(scope="module")
def fresh():
    """A fresh Celo2LOpt theta and its first update without the rule."""
    theta = lopt.Celo2LOpt().init(jax.random.key(0))
    return theta, first_update(lopt.Celo2LOpt(), theta)


def check_decay(on, off, lam, roles):
    """Δp(rule) − Δp(no rule) = −η(p)·λ·p on the decayed roles, exactly 0 on the others."""
    for k, eta in ETA.items():
        p = PARAMS[k[0]][k[1]].astype(np.float64)
        if ROLES[k] in roles:
            np.testing.assert_allclose(on[k] - off[k], -eta * lam * p, rtol=1e-4, atol=1e-8, err_msg=str(k))
        else:
            np.testing.assert_array_equal(on[k], off[k], err_msg=str(k))


def test_learned_decay_is_step_size_times_rate_times_param_on_matrices(fresh):
    """The default roles: both matrices decay, each at its own path's step size η(p) (0.02 on the
    orthogonalized kernel, 0.003 on the one-output kernel's NAdamW path), λ = 0.1·exp(3·tanh(0.4));
    the bias and the embedding are untouched."""
    theta, off = fresh
    on = first_update(lopt.Celo2LOpt(wd_rate=0.1, wd_learned=True), {**theta, wd_rule.THETA_KEY: {"s": jnp.float32(0.4)}})
    check_decay(on, off, 0.1 * math.exp(3.0 * math.tanh(0.4)), ("matrix",))


def test_fixed_decay_on_every_role_is_muons_weight_decay_bit_for_bit(fresh):
    """A fixed λ on every role decays each tensor by η(p)·λ·p, and is Celo2LOpt's own `weight_decay`
    (optax.contrib.muon's, every tensor) to the bit."""
    theta, off = fresh
    every = ("matrix", "vector", "embedding")
    rule = first_update(lopt.Celo2LOpt(wd_rate=0.05, wd_roles=every), theta)
    check_decay(rule, off, 0.05, every)
    muon = first_update(lopt.Celo2LOpt(weight_decay=0.05), theta)
    for k in ETA:
        np.testing.assert_array_equal(rule[k], muon[k])


def test_off_by_default_adds_nothing():
    """The rule's options are absent from configs and theta while it is off, and an off rule's other
    options change nothing in the traced update (the same jaxpr as without them)."""
    assert not any(k.startswith("wd_") for k in lopt.Celo2LOpt().config())
    lo, theta = lopt.pretrained.deployed_learned_optimizer("celo2_v5")
    assert lo.wd_rate == 0 and wd_rule.THETA_KEY not in theta
    assert not any(k.startswith("wd_") for k in lopt.pretrained.info("celo2_v5")["config"])
    theta = lopt.Celo2LOpt().init(jax.random.key(0))

    def jaxpr(learned_opt):
        tx = learned_opt.opt_fn(theta)
        return str(jax.make_jaxpr(lambda g, p: tx.update(g, tx.init(p), p, loss=1.0)[0])(GRADS, PARAMS))

    assert jaxpr(lopt.Celo2LOpt()) == jaxpr(lopt.Celo2LOpt(wd_log_range=1.0, wd_roles=("vector",), wd_loss_max=3.0,
                                                           wd_loss_free=2.0))


def test_learned_rate_gets_the_meta_gradient_of_its_loss():
    """d(loss after 3 steps of a one-output linear regression)/ds is nonzero and agrees with a central
    difference (the [4, 1] kernel is a matrix on the NAdamW path: decayed at η_adam)."""
    lo = lopt.Celo2LOpt(wd_rate=0.5, wd_learned=True)
    theta = lo.init(jax.random.key(0))
    x = jnp.asarray(RNG.randn(16, 4), jnp.float32)
    y = x @ jnp.asarray(RNG.randn(4, 1), jnp.float32)
    loss_fn = lambda w: jnp.mean(jnp.square(x @ w["kernel"] - y))

    @jax.jit
    @jax.value_and_grad
    def meta_loss(s):
        tx = lo.opt_fn({**theta, wd_rule.THETA_KEY: {"s": s}}, num_steps=3)
        w = {"kernel": jnp.asarray(PARAMS["dense"]["kernel"][:, :1])}

        def step(carry, _):
            w, state = carry
            loss, g = jax.value_and_grad(loss_fn)(w)
            u, state = tx.update(g, state, w, loss=loss)
            return (optax.apply_updates(w, u), state), None

        (w, _), _ = jax.lax.scan(step, (w, tx.init(w)), length=3)
        return loss_fn(w)

    s0, h = 0.1, 0.05
    grad = float(meta_loss(jnp.float32(s0))[1])
    fd = (float(meta_loss(jnp.float32(s0 + h))[0]) - float(meta_loss(jnp.float32(s0 - h))[0])) / (2 * h)
    assert abs(grad) > 1e-4, grad
    np.testing.assert_allclose(grad, fd, rtol=0.05)


def test_checks_name_the_bad_option():
    with pytest.raises(ValueError, match="wd_learned=True needs wd_rate > 0"):
        lopt.Celo2LOpt(wd_learned=True)
    with pytest.raises(ValueError, match="wd_rate must be >= 0"):
        lopt.Celo2LOpt(wd_rate=-0.1)
    with pytest.raises(ValueError, match="wd_roles"):
        lopt.Celo2LOpt(wd_rate=0.1, wd_roles=("bias",))
    with pytest.raises(ValueError, match="wd_log_range"):
        lopt.Celo2LOpt(wd_rate=0.1, wd_log_range=0.0)


def test_a_shipped_theta_fine_tunes_with_a_learned_rate():
    """train.theta_init = "pretrained:celo2_v5" with the learned rule named in theta_init_changes: every
    leaf as shipped, plus s = 0 (λ = wd_rate); without naming the change it is refused."""
    saved, theta = lopt.pretrained.load_learned_optimizer_by_name("celo2_v5")
    lo = type(saved)(**{**saved.config(), "wd_rate": 0.1, "wd_learned": True})
    got = load_theta_init("pretrained:celo2_v5", lo, ["wd_rate", "wd_learned"])
    assert float(got[wd_rule.THETA_KEY]["s"]) == 0.0
    chex_equal = jax.tree_util.tree_map(np.array_equal, theta, theta_without_decay(got))
    assert all(jax.tree_util.tree_leaves(chex_equal))
    with pytest.raises(ValueError, match="wd_learned"):
        load_theta_init("pretrained:celo2_v5", lo, [])


def updates_after(learned_opt, theta, losses):
    """The update of the last of len(losses) steps on the same gradients, each step given its loss."""
    tx, params = learned_opt.opt_fn(theta), PARAMS
    state = tx.init(params)
    for loss in losses:
        updates, state = tx.update(GRADS, state, params, **({} if loss is None else {"loss": loss}))
    return {k: np.asarray(updates[k[0]][k[1]], np.float64) for k in ETA}, state


@pytest.mark.parametrize("power,max_factor", [(0.5, 10.0), (2.0, 1.1)])
def test_loss_aware_decay_scales_the_rate_by_the_loss_ratio(fresh, power, max_factor):
    """Losses 1 then 0.01: ℓ_0 = 1, ℓ̄ = 0.9·1 + 0.1·0.01 = 0.901, so the second step decays at
    λ·φ with φ = min((1/0.901)^p, φ_max) (1.0535 unclipped; 1.1 at p = 2 clipped), i.e. λ(φ − 1) more
    than the fixed rule, on the decayed roles only."""
    theta = fresh[0]
    fixed, _ = updates_after(lopt.Celo2LOpt(wd_rate=0.2), theta, [1.0, 0.01])
    aware, state = updates_after(lopt.Celo2LOpt(wd_rate=0.2, wd_loss_power=power, wd_loss_max=max_factor), theta,
                                 [1.0, 0.01])
    phi = min((1.0 / 0.901) ** power, max_factor)
    check_decay(aware, fixed, 0.2 * (phi - 1.0), ("matrix",))
    assert float(state.loss_start) == 1.0


def test_loss_aware_factor_is_one_without_a_loss_and_off_by_default(fresh):
    """No loss given: φ = 1, the update is the fixed rule's bit for bit; wd_loss_power = 0 keeps no ℓ_0."""
    theta = fresh[0]
    fixed, state = updates_after(lopt.Celo2LOpt(wd_rate=0.2), theta, [None, None])
    aware, aware_state = updates_after(lopt.Celo2LOpt(wd_rate=0.2, wd_loss_power=1.0), theta, [None, None])
    for k in ETA:
        np.testing.assert_array_equal(aware[k], fixed[k])
    assert state.loss_start is None and float(aware_state.loss_start) == 0.0
    assert "loss_start" not in [f.name for f in lopt.Celo2LOpt(wd_rate=0.2).spec().state]
    assert "loss_start" in [f.name for f in lopt.Celo2LOpt(wd_rate=0.2, wd_loss_power=1.0).spec().state]


def test_loss_factor_clips_and_ignores_nonpositive_losses():
    f = lambda start, ema, p=0.25, m=10.0, free=1.0: float(wd_rule.loss_factor(jnp.float32(start), jnp.float32(ema),
                                                                                 p, m, free))
    np.testing.assert_allclose(f(2.0, 2e-4), 10.0 ** (4 * 0.25), rtol=1e-6)  # (10^4)^0.25 = 10
    assert f(2.0, 2e-8) == 10.0  # clipped at φ_max
    assert f(1.0, 3.0) == 1.0  # a loss above its start: no less than λ
    np.testing.assert_allclose(f(2.0, 0.1, p=1.0, free=10.0), 2.0, rtol=1e-6)  # a 20-fold fall, 10 of it free
    assert f(2.0, 0.4, p=1.0, free=10.0) == 1.0  # a 5-fold fall: within ρ_free
    assert f(0.0, 1e-3) == 1.0 and f(-1.0, -1e-3) == 1.0 and f(1.0, 0.0) == 1.0  # no positive ratio: λ


def test_loss_start_is_the_first_loss_given_and_then_kept():
    lo = lopt.Celo2LOpt(wd_rate=0.1, wd_loss_power=0.5)
    _, state = updates_after(lo, lo.init(jax.random.key(0)), [None, 3.0, 0.5, 7.0])
    assert float(state.loss_start) == 3.0


def test_loss_aware_checks_name_the_bad_option():
    with pytest.raises(ValueError, match="wd_loss_power > 0 needs wd_rate > 0"):
        lopt.Celo2LOpt(wd_loss_power=0.5)
    with pytest.raises(ValueError, match="wd_loss_power must be >= 0"):
        lopt.Celo2LOpt(wd_rate=0.1, wd_loss_power=-1.0)
    with pytest.raises(ValueError, match="wd_loss_free must be > 0"):
        lopt.Celo2LOpt(wd_rate=0.1, wd_loss_power=0.5, wd_loss_free=0.0)
    with pytest.raises(ValueError, match="wd_loss_max must be >= 1"):
        lopt.Celo2LOpt(wd_rate=0.1, wd_loss_power=0.5, wd_loss_max=0.5)


@pytest.mark.slow  # heavy; the fast tier keeps a smaller check of the same part
def test_conv_kernels_take_their_own_loss_free_ratio():
    """With wd_conv_loss_free the conv kernel's update is that of a run whose ρ_free is the conv one
    for every tensor, and the dense kernel's that of a run with wd_loss_free, bit for bit; the two
    differ (losses 1 then 0.01: ℓ̄ = 0.901, φ = 1.11/ρ clipped at 1, so ρ = 0.5 and 1 decay differently)."""
    params = {"Conv_0": {"kernel": RNG.randn(3, 3, 2, 4).astype(np.float32)},
              "Dense_0": {"kernel": RNG.randn(4, 3).astype(np.float32)}}
    grads = jax.tree_util.tree_map(lambda p: RNG.randn(*p.shape).astype(np.float32), params)
    assert param_roles.infer(params)["Conv_0"]["kernel"].is_conv
    assert not param_roles.infer(params)["Dense_0"]["kernel"].is_conv
    theta = lopt.Celo2LOpt().init(jax.random.key(0))

    def update(**options):
        tx = lopt.Celo2LOpt(wd_rate=0.2, wd_loss_power=1.0, **options).opt_fn(theta)
        state = tx.init(params)
        for loss in (1.0, 0.01):
            u, state = tx.update(grads, state, params, loss=loss)
        return {k: np.asarray(u[k]["kernel"]) for k in params}

    mixed, conv_like, dense_like = (update(wd_loss_free=1.0, wd_conv_loss_free=0.5), update(wd_loss_free=0.5),
                                    update(wd_loss_free=1.0))
    np.testing.assert_array_equal(mixed["Conv_0"], conv_like["Conv_0"])
    np.testing.assert_array_equal(mixed["Dense_0"], dense_like["Dense_0"])
    assert not np.array_equal(conv_like["Conv_0"], dense_like["Conv_0"])
    same = update(wd_loss_free=1.0, wd_conv_loss_free=1.0)
    for k in params:
        np.testing.assert_array_equal(same[k], dense_like[k])


def test_conv_loss_free_checks_name_the_bad_option():
    with pytest.raises(ValueError, match="wd_conv_loss_free must be >= 0"):
        lopt.Celo2LOpt(wd_rate=0.1, wd_loss_power=0.5, wd_conv_loss_free=-1.0)
    with pytest.raises(ValueError, match="wd_conv_loss_free > 0 needs wd_loss_power > 0"):
        lopt.Celo2LOpt(wd_rate=0.1, wd_conv_loss_free=3.0)


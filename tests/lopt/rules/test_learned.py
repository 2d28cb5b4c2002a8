"""lopt.rules.learned: a rule chain's constants as meta-parameters in theta. A fresh theta applies the
chain exactly as given; jax.grad of a short inner run's loss reaches every learnable constant (finite,
non-zero); the constants stay within their bounds; a RuledLOpt round-trips through a theta file."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lopt
import lopt.archs.learnable_hparams
from lopt.rules import chain, learned

ARCH = dict(hidden_size=4, lr_hidden_size=4, layout="cpu")
N = 40  # the inner run's horizon: past the horizon part's reference, so its factor bites
CHAIN = [{"part": "scheduled", "name": "cosine"},
         {"part": "horizon_scaled", "reference": 10, "power": 1.0, "residual_power": 2.0},
         {"part": "depth_scaled", "reference": 1, "power": 1.0},
         {"part": "loss_aware_decay", "rate": 0.03, "loss_power": 1.0, "loss_max": 10.0, "loss_free": 0.5},
         {"part": "growth_limited", "free": 0.5},
         {"part": "conv_step_scaled", "scale": 3.0}]
EXACT = ("loss_aware_decay.rate", "loss_aware_decay.loss_free", "conv_step_scaled.scale")
POWERS = ("horizon_scaled.power", "horizon_scaled.residual_power", "depth_scaled.power")


def convnet():
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    return {"Conv_0": {"kernel": jax.random.normal(k1, (3, 3, 2, 4)) / 4.0, "bias": jnp.zeros(4)},
            "Dense_0": {"kernel": jax.random.normal(k2, (4, 8)) / 2.0, "bias": jnp.zeros(8)},
            "Dense_1": {"kernel": jax.random.normal(k3, (8, 3)) / 3.0, "bias": jnp.zeros(3)}}


def loss_fn(p):
    return sum(jnp.mean(jnp.tanh(x - 0.2) ** 2) + 0.05 * jnp.mean(x ** 4) for x in jax.tree_util.tree_leaves(p))


def run(tx, steps=4):
    """The updates ([steps] stacked per leaf) and the final loss of `steps` steps of `tx` on `loss_fn`."""
    def step(carry, _):
        p, state = carry
        loss, g = jax.value_and_grad(loss_fn)(p)
        u, state = tx.update(g, state, p, loss=loss)
        return (optax.apply_updates(p, u), state), u

    p = convnet()
    (p, _), out = jax.lax.scan(step, (p, tx.init(p)), None, length=steps)
    return out, loss_fn(p)


ADAM_CHAIN = [{"part": "scheduled", "name": "cosine"}, {"part": "horizon_scaled", "reference": 10, "power": 0.5},
              {"part": "depth_scaled", "reference": 1, "power": 1.0}, {"part": "conv_step_scaled", "scale": 2.0}]
ADAM_LEARNABLE = ("horizon_scaled.power", "depth_scaled.power", "conv_step_scaled.scale")


def test_any_learned_optimizer_takes_learnable_rules():
    """Around LearnableAdam (the fast case): its theta gains theta["rules"]; a fresh one is the fixed chain
    (the scale bit for bit); the meta-gradient reaches every learnable constant."""
    inner = lopt.archs.learnable_hparams.LearnableAdam(learning_rate=1e-2)
    lo = learned.with_rules(inner, ADAM_CHAIN, learnable=ADAM_LEARNABLE)
    theta = lo.init(jax.random.key(0))
    assert set(theta["rules"]) == {"horizon_scaled", "depth_scaled", "conv_step_scaled"}
    only_scale = learned.with_rules(inner, ADAM_CHAIN, learnable=("conv_step_scaled.scale",))

    @jax.jit
    def measure(base, theta, theta_scale):  # one compilation for the three runs and the meta-gradient
        fixed = run(chain.apply(inner.opt_fn(base), ADAM_CHAIN, num_steps=N))[0]
        got, scale_only = run(lo.opt_fn(theta, num_steps=N))[0], run(only_scale.opt_fn(theta_scale, num_steps=N))[0]
        return fixed, got, scale_only, jax.grad(lambda th: run(lo.opt_fn(th, num_steps=N))[1])(theta)["rules"]

    fixed, got, scale_only, grads = measure(inner.init(None), theta, only_scale.init(jax.random.key(0)))
    for a, b, c in zip(*(jax.tree_util.tree_leaves(x) for x in (fixed, got, scale_only))):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=2e-5, atol=1e-10)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(c))
    for name in ADAM_LEARNABLE:
        part, _, const = name.partition(".")
        g = float(grads[part][const])
        assert np.isfinite(g) and g != 0.0, (name, g)


@pytest.mark.slow
def test_a_fresh_theta_is_the_fixed_chain():
    """s = 0 gives c₀ · exp(0): the multiplicative constants bit for bit, the powers to float32 rounding."""
    inner = lopt.Celo2LOpt(**ARCH)
    base = inner.init(jax.random.key(1))
    fixed, _ = jax.jit(lambda th: run(chain.apply(inner.opt_fn(th, num_steps=N), CHAIN, num_steps=N)))(base)
    for names, exact in ((EXACT, True), (POWERS, False)):
        lo = learned.with_rules(inner, CHAIN, learnable=names)
        theta = lo.init(jax.random.key(1))
        assert set(theta) == {"mlp", "lr", "rules"}
        got, _ = jax.jit(lambda th: run(lo.opt_fn(th, num_steps=N)))(theta)
        for a, b in zip(jax.tree_util.tree_leaves(fixed), jax.tree_util.tree_leaves(got)):
            if exact:
                np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
            else:
                np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=2e-5, atol=1e-9)


@pytest.mark.slow
def test_meta_gradient_reaches_every_learnable_constant():
    """Around Celo2LOpt, every learnable constant of every part, those acting inside it included."""
    lo = learned.with_rules(lopt.Celo2LOpt(**ARCH), CHAIN, learnable=EXACT + POWERS)
    theta = lo.init(jax.random.key(1))
    grads = jax.jit(jax.grad(lambda th: run(lo.opt_fn(th, num_steps=N))[1]))(theta)["rules"]
    for name in EXACT + POWERS:
        part, _, const = name.partition(".")
        g = float(grads[part][const])
        assert np.isfinite(g) and g != 0.0, (name, g)


def test_constants_are_bounded_and_log_parametrised():
    assert float(learned.constant_value(0.03, jnp.float32(0.0), 3.0)) == np.float32(0.03)
    for s in (-50.0, 50.0):
        c = float(learned.constant_value(0.03, jnp.float32(s), 3.0))
        assert 0.03 * np.exp(-3.0) * (1 - 1e-6) <= c <= 0.03 * np.exp(3.0) * (1 + 1e-6)


def test_refuses_what_cannot_be_learned():
    inner = lopt.Celo2LOpt(**ARCH)
    with pytest.raises(ValueError, match="cannot be learnable"):
        learned.with_rules(inner, CHAIN, learnable=("growth_limited.free",))
    with pytest.raises(ValueError, match="exactly one 'overshoot_brake'|cannot be learnable"):
        learned.with_rules(inner, CHAIN, learnable=("overshoot_brake.gain",))
    with pytest.raises(ValueError, match="exactly one"):
        learned.with_rules(inner, CHAIN[:1], learnable=("loss_aware_decay.rate",))
    with pytest.raises(ValueError, match="nonzero"):
        learned.with_rules(inner, [{"part": "horizon_scaled", "reference": 10, "power": 1.0, "residual_power": 0.0}],
                           learnable=("horizon_scaled.residual_power",))
    with pytest.raises(ValueError, match="unknown rule part"):
        learned.with_rules(inner, [{"part": "nope"}])
    with pytest.raises(ValueError, match="rate must be >= 0"):
        learned.with_rules(inner, [{"part": "loss_aware_decay", "rate": -1.0}])


def test_saves_and_loads_as_a_theta_file(tmp_path):
    lo = learned.with_rules(lopt.Celo2LOpt(**ARCH), CHAIN, learnable=("loss_aware_decay.rate",), log_range=2.0)
    theta = lo.init(jax.random.key(1))
    theta["rules"]["loss_aware_decay"]["rate"] = jnp.float32(0.25)
    lopt.save_theta(str(tmp_path / "t.msgpack"), lo, theta)
    back, theta_back = lopt.load_learned_optimizer(str(tmp_path / "t.msgpack"))
    assert back == lo and hash(back) == hash(lo) and back.config() == lo.config()
    assert float(theta_back["rules"]["loss_aware_decay"]["rate"]) == 0.25

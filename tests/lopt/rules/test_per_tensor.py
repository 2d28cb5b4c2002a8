"""lopt.rules.per_tensor: the step-size rules (schedule, horizon with its residual fade, depth), the
loss-aware decay and the growth limit act from outside a learned update on the quantities inside it
(each tensor's step size, the learned residual), bit for bit the rules its architecture held as fields;
a shipped record's rule chain (lopt.pretrained.rule_chain) builds them."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lopt
import lopt.pretrained
import lopt.rules
from lopt.pretrained import rule_chain
from lopt.rules import per_tensor, radial

ARCH = dict(hidden_size=4, lr_hidden_size=4, layout="cpu")


def params(scale=0.3):
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    return {"Dense_0": {"kernel": jax.random.normal(k1, (6, 8)) * scale, "bias": jnp.zeros(8)},
            "Dense_1": {"kernel": jax.random.normal(k2, (8, 8)) * scale, "bias": jnp.zeros(8)},
            "Embed_0": {"embedding": jax.random.normal(k3, (5, 6))}}


def updates(tx, p, n=3):
    """n updates (params moved by each) with falling losses, so that the loss-aware factor grows."""
    state, out, update = tx.init(p), [], jax.jit(tx.update)
    for i in range(n):
        g = jax.tree_util.tree_map(lambda x: jnp.cos(3.0 * x + i) - 0.3 * x, p)
        u, state = update(g, state, p, loss=jnp.float32(4.0 / (1.0 + 3.0 * i)))
        out.append(u)
        p = optax.apply_updates(p, u)
    return out


def assert_identical(a, b):
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_celo2_takes_the_interface_and_plain_optax_does_not():
    lo = lopt.Celo2LOpt(**ARCH)
    tx = lo.opt_fn(lo.init(jax.random.key(1)), num_steps=10)
    assert per_tensor.supports(tx) and isinstance(tx, optax.GradientTransformationExtraArgs)
    assert per_tensor.supports(lopt.rules.conv_step_scaled(radial.growth_limited(tx, 4.0), 3.0))
    assert not per_tensor.supports(lopt.rules.loss_aware_decay(optax.adam(1e-3), 1e-3, 0.03))
    with pytest.raises(ValueError, match="learning_rate=None"):
        lopt.rules.loss_aware_decay(optax.adam(1e-3), None, 0.03)


@pytest.mark.slow  # heavy; the fast tier keeps a smaller check of the same part
def test_loss_aware_decay_outside_celo2_is_its_wd_fields_bit_for_bit():
    """λ₀ φ_t enters each decayed tensor's bracket, times that tensor's own η, as the fields did."""
    wd = dict(rate=0.03, loss_power=1.0, loss_max=10.0, loss_free=3.0)
    inside = lopt.Celo2LOpt(**ARCH, wd_rate=0.03, wd_loss_power=1.0, wd_loss_max=10.0, wd_loss_free=3.0)
    theta = inside.init(jax.random.key(1))
    outside = lopt.rules.loss_aware_decay(lopt.Celo2LOpt(**ARCH).opt_fn(theta, num_steps=10), None, **wd)
    ref, got = updates(inside.opt_fn(theta, num_steps=10), params()), updates(outside, params())
    assert_identical(ref, got)
    plain = updates(lopt.Celo2LOpt(**ARCH).opt_fn(theta, num_steps=10), params())
    assert not np.array_equal(plain[-1]["Dense_1"]["kernel"], got[-1]["Dense_1"]["kernel"])  # it decays
    np.testing.assert_array_equal(plain[0]["Embed_0"]["embedding"], got[0]["Embed_0"]["embedding"])  # matrices only


def test_growth_limited_outside_celo2_acts_on_its_residual_bit_for_bit():
    """Around Celo2LOpt the limit acts on the learned residual (residual_no_growth), not the whole step."""
    inside = lopt.Celo2LOpt(**ARCH, residual_no_growth=True, residual_growth_free=4.0)
    theta = inside.init(jax.random.key(2))
    outside = radial.growth_limited(lopt.Celo2LOpt(**ARCH).opt_fn(theta, num_steps=10), 4.0)
    large = params(scale=3.0)  # rms · √fan_in ≈ 7-8 > 4: the rule acts
    assert_identical(updates(inside.opt_fn(theta, num_steps=10), large), updates(outside, large))
    plain = lopt.Celo2LOpt(**ARCH).opt_fn(theta, num_steps=10)
    whole = radial.growth_limited(optax.GradientTransformationExtraArgs(plain.init, plain.update), 4.0)
    assert not per_tensor.supports(whole)  # around a plain transform it limits the whole step instead


def test_rules_nest_and_reach_the_learned_update_together():
    wd = dict(wd_rate=0.03, wd_loss_power=1.0, wd_loss_max=10.0, wd_loss_free=3.0)
    inside = lopt.Celo2LOpt(**ARCH, **wd, residual_no_growth=True, residual_growth_free=4.0)
    theta = inside.init(jax.random.key(3))
    tx = lopt.Celo2LOpt(**ARCH).opt_fn(theta, num_steps=10)
    chain = rule_chain.apply(tx, [{"part": "loss_aware_decay", "rate": 0.03, "loss_power": 1.0, "loss_max": 10.0,
                                   "loss_free": 3.0}, {"part": "growth_limited", "free": 4.0}])
    large = params(scale=3.0)
    assert_identical(updates(inside.opt_fn(theta, num_steps=10), large), updates(chain, large))


def test_rule_fields_translate_to_a_chain_and_back():
    """An older config's rule fields become the chain a record holds; `to_fields` is the inverse."""
    record = lopt.pretrained.info("celo2_v9")
    legacy = {**record["deploy_options"], **rule_chain.to_fields("Celo2LOpt", record["rules"])}
    assert legacy["wd_rate"] == 0.03 and legacy["residual_no_growth"] and legacy["conv_step_scale"] == 3.0
    config, rules = rule_chain.from_fields("Celo2LOpt", legacy)
    assert rules == record["rules"] and config == record["deploy_options"]
    assert rule_chain.from_fields("NormMLPLOpt", {"overshoot_gain": 0.2}) == (
        {}, [{"part": "overshoot_brake", "gain": 0.2, "threshold": 0.15}])
    steps = {"schedule": "cosine", "horizon_reference": 2000, "depth_reference": 3}
    assert rule_chain.from_fields("Celo2LOpt", steps)[1] == [
        {"part": "scheduled", "name": "cosine"},
        {"part": "horizon_scaled", "reference": 2000, "power": 0.5, "residual_power": 0.0},
        {"part": "depth_scaled", "reference": 3, "power": 1.0}]
    assert rule_chain.to_fields("Celo2LOpt", rule_chain.from_fields("Celo2LOpt", steps)[1]) == {
        **steps, "horizon_power": 0.5, "residual_horizon_power": 0.0, "depth_power": 1.0}
    learned = {"wd_rate": 0.03, "wd_learned": True}  # a learned λ lives in theta: it stays on the architecture
    assert rule_chain.from_fields("Celo2LOpt", learned) == (learned, [])
    with pytest.raises(ValueError, match="unknown rule part"):
        rule_chain.apply(optax.adam(1e-3), [{"part": "nope"}])


def test_shipped_records_hold_their_rules_as_a_chain():
    """A record's "rules" is its whole deploy chain: no rule among its deploy options, and the parts of the
    rules its config was meta-trained with (translated, `from_fields`) lead it; `deploy_options` still states them
    as fields (the form lopt.torch reads)."""
    moved = {"schedule", "horizon_reference", "depth_reference", "wd_rate", "residual_no_growth", "conv_step_scale",
             "overshoot_gain"}
    for name in lopt.pretrained.names():
        record = lopt.pretrained.info(name)
        assert not moved & set(record["deploy_options"]), name
        meta_trained = rule_chain.from_fields(record["architecture"], record["config"])[1]
        parts = [r["part"] for r in record["rules"]]
        assert parts[:len(meta_trained)] == [r["part"] for r in meta_trained], name  # constants may differ (v5: β)
    assert [r["part"] for r in lopt.pretrained.info("celo2_v9")["rules"]] == [
        "scheduled", "horizon_scaled", "depth_scaled", "loss_aware_decay", "growth_limited", "conv_step_scaled"]
    assert lopt.pretrained.deploy_options("celo2_v9")["wd_loss_free"] == 3.0
    assert lopt.pretrained.deploy_options("celo2_v9")["residual_horizon_power"] == 2.0
    assert lopt.pretrained.deployed_learned_optimizer("normmlp_v3")[0].overshoot_gain == 0.2


@pytest.mark.slow  # heavy; the fast tier keeps a smaller check of the same part
def test_step_size_rules_outside_celo2_are_its_fields_bit_for_bit():
    """scheduled, horizon_scaled (its residual fade included) and depth_scaled around Celo2LOpt multiply each
    tensor's own step size (depth: the matrices') and fade the learned residual, as its fields did."""
    fields = dict(schedule="cosine", horizon_reference=4, horizon_power=1.0, residual_horizon_power=2.0,
                  depth_reference=1, depth_power=1.0)
    inside = lopt.Celo2LOpt(**ARCH, **fields)
    theta = inside.init(jax.random.key(1))
    config, rules = rule_chain.from_fields("Celo2LOpt", inside.config())
    assert [r["part"] for r in rules] == ["scheduled", "horizon_scaled", "depth_scaled"]
    outside = rule_chain.apply(lopt.Celo2LOpt(**config, layout="cpu").opt_fn(theta, num_steps=10), rules,
                               num_steps=10)
    ref = updates(inside.opt_fn(theta, num_steps=10), params(), n=2)
    assert_identical(ref, updates(outside, params(), n=2))
    plain = updates(lopt.Celo2LOpt(**ARCH).opt_fn(theta, num_steps=10), params(), n=2)
    assert not np.allclose(plain[1]["Dense_0"]["kernel"], ref[1]["Dense_0"]["kernel"])
    with pytest.raises(ValueError, match="residual_power"):
        lopt.rules.horizon_scaled(optax.adam(1e-3), 10, 4, residual_power=2.0)

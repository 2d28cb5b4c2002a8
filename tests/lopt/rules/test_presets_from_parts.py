"""Shipped presets rebuilt from lopt.rules' parts give today's updates over 200 steps: `normmlp_v3` is its
meta-trained NormMLPLOpt inside `overshoot_brake` (bit for bit), and `celo2_v9` is `celo2_v8` inside
`conv_step_scaled(3)` (bit for bit on an MLP, where the factor is 1; ≤ 1e-6 relative on a convnet,
where the factor multiplies the step instead of the step sizes). Both transforms see the same params
(the reference's trajectory) and gradients, so each step compares the updates themselves."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lopt
import lopt.parts.layout
import lopt.rules
from lopt.rules import overshoot_brake

STEPS = 200


def mlp():
    k1, k2 = jax.random.split(jax.random.key(0))
    return {"Dense_0": {"kernel": jax.random.normal(k1, (16, 32)) / 4.0, "bias": jnp.zeros(32)},
            "Dense_1": {"kernel": jax.random.normal(k2, (32, 10)) / 6.0, "bias": jnp.zeros(10)}}


def convnet():
    k1, k2 = jax.random.split(jax.random.key(1))
    return {"Conv_0": {"kernel": jax.random.normal(k1, (3, 3, 1, 8)) / 3.0, "bias": jnp.zeros(8)},
            "Dense_0": {"kernel": jax.random.normal(k2, (8, 10)) / 3.0, "bias": jnp.zeros(10)}}


def updates_side_by_side(reference, rebuilt, params):
    """[STEPS] max over leaves of |u_rebuilt − u_ref| / (|u_ref| + tiny), and whether every update was
    bit-identical, both transforms updating at the reference's params, with the same gradients and loss."""
    def step(carry, i):
        p, sa, sb = carry
        g = jax.tree_util.tree_map(lambda x: jnp.cos(3.0 * x + i) - 0.3 * x, p)
        loss = 1.0 / (1.0 + 0.05 * i.astype(jnp.float32))
        ua, sa = reference.update(g, sa, p, loss=loss)
        ub, sb = rebuilt.update(g, sb, p, loss=loss)
        rel = jnp.max(jnp.stack([jnp.max(jnp.abs(b - a) / (jnp.abs(a) + 1e-30)) for a, b in
                                 zip(jax.tree_util.tree_leaves(ua), jax.tree_util.tree_leaves(ub))]))
        same = jnp.all(jnp.stack([jnp.all(a == b) for a, b in
                                  zip(jax.tree_util.tree_leaves(ua), jax.tree_util.tree_leaves(ub))]))
        return (jax.tree_util.tree_map(jnp.add, p, ua), sa, sb), (rel, same)

    carry = (params, reference.init(params), rebuilt.init(params))
    _, (rel, same) = jax.jit(lambda c: jax.lax.scan(step, c, jnp.arange(STEPS)))(carry)
    return np.asarray(rel), bool(np.all(same))


def _layout(lo):
    return dataclasses.replace(lo, layout=lopt.parts.layout.for_platform(jax.default_backend()))


@pytest.mark.slow  # two NormMLPLOpt updates in one compiled scan
def test_normmlp_v3_is_its_meta_trained_optimizer_inside_the_brake_part():
    meta_trained, theta = lopt.pretrained.load_learned_optimizer_by_name("normmlp_v3")
    assert meta_trained.overshoot_gain == 0 and lopt.pretrained.deploy_options("normmlp_v3") == {
        "overshoot_gain": 0.2, "overshoot_threshold": 0.15}
    rebuilt = overshoot_brake.overshoot_brake(_layout(meta_trained).opt_fn(theta, num_steps=STEPS), 0.2,
                                              meta_trained.overshoot_threshold)
    _, same = updates_side_by_side(lopt.pretrained.load("normmlp_v3", num_steps=STEPS), rebuilt, mlp())
    assert same


def transformer():
    k = jax.random.split(jax.random.key(2), 6)
    d = 8
    return {"Embed_0": {"embedding": jax.random.normal(k[0], (20, d))},
            "MultiHeadDotProductAttention_0": {
                "query": {"kernel": jax.random.normal(k[1], (d, 2, 4)) / 3.0, "bias": jnp.zeros((2, 4))},
                "out": {"kernel": jax.random.normal(k[2], (2, 4, d)) / 3.0, "bias": jnp.zeros(d)}},
            "LayerNorm_0": {"scale": jnp.ones(d), "bias": jnp.zeros(d)},
            "Dense_0": {"kernel": jax.random.normal(k[3], (d, 4 * d)) / 3.0, "bias": jnp.zeros(4 * d)},
            "Dense_1": {"kernel": jax.random.normal(k[4], (4 * d, d)) / 6.0, "bias": jnp.zeros(d)}}


@pytest.mark.slow  # two Celo2LOpt updates in one compiled scan, three models, five names
@pytest.mark.parametrize("name", ["celo2_v6", "celo2_v7", "celo2_v8", "celo2_v9", "normmlp_v3"])
def test_load_from_the_rule_chain_is_the_architecture_with_rule_fields(name):
    """`lopt.pretrained.load` (the architecture without rule fields inside its record's chain of parts) gives
    the updates of the architecture that holds the same rules as fields (`deployed_learned_optimizer`,
    today's path) over 200 steps: bit for bit where no step is rescaled outside the update (MLP,
    transformer; normmlp_v3's brake everywhere), ≤ 1e-6 relative where conv_step_scaled multiplies the
    step instead of the step sizes (celo2_v9 on a convnet)."""
    lo, theta = lopt.pretrained.deployed_learned_optimizer(name)
    fields = _layout(lo).opt_fn(theta, num_steps=STEPS)
    for model, exact in ((mlp, True), (transformer, True), (convnet, name != "celo2_v9")):
        rel, same = updates_side_by_side(fields, lopt.pretrained.load(name, num_steps=STEPS), model())
        assert same if exact else rel.max() <= 1e-6, (name, model.__name__, rel.max())


@pytest.mark.slow  # two Celo2LOpt updates in one compiled scan, twice
def test_celo2_v9_is_celo2_v8_inside_the_conv_step_part():
    v8, theta = lopt.pretrained.deployed_learned_optimizer("celo2_v8")
    rebuilt = lopt.rules.conv_step_scaled(_layout(v8).opt_fn(theta, num_steps=STEPS), 3.0)
    reference = lopt.pretrained.load("celo2_v9", num_steps=STEPS)
    _, same = updates_side_by_side(reference, rebuilt, mlp())
    assert same  # no conv kernel: the factor is 1.0, a float32 product that changes no bit
    rel, _ = updates_side_by_side(reference, rebuilt, convnet())
    assert rel.max() <= 1e-6, (rel.max(), int(rel.argmax()))

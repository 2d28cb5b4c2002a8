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


# Pinned before the rules became parts (2026-12-07: Celo2LOpt still held schedule, horizon and depth as
# fields): step 20's first four update entries and the sum of |update| over the 20 steps, per
# (name, model, horizon), on `_pin_mlp` / `_pin_convnet` with `_pin_loss` (CPU, float32).
PINNED = {
    ("celo2_v9", "mlp", 6000): ([0.00023247490753419697, -0.00016774427786003798, -5.185216650716029e-05,
                                 -0.00014520819240715355], 2.0429816246032715),
    ("celo2_v9", "conv", 60): ([0.003838280215859413, -0.005449589341878891, -0.0006167260580696166,
                                -0.007395533379167318], 190.1837615966797),
    ("normmlp_v3", "conv", 6000): ([0.006998869124799967, -0.005749536212533712, -0.0012303207768127322,
                                    -0.005700187757611275], 12.005393981933594),
    ("celo2_v5", "mlp", 6000): ([0.00023247765784617513, -0.00016774627147242427, -5.185278132557869e-05,
                                 -0.00014520992408506572], 1.999451994895935),
}


def _pin_mlp():
    ks, dims = jax.random.split(jax.random.key(7), 8), [12, 16, 16, 16, 6]
    return {f"Dense_{i}": {"kernel": jax.random.normal(ks[i], (dims[i], dims[i + 1])) / np.sqrt(dims[i]),
                           "bias": jnp.zeros((dims[i + 1],))} for i in range(4)}


def _pin_convnet():
    ks = jax.random.split(jax.random.key(7), 4)
    return {"Conv_0": {"kernel": jax.random.normal(ks[0], (3, 3, 2, 4)) / np.sqrt(18), "bias": jnp.zeros((4,))},
            "Conv_1": {"kernel": jax.random.normal(ks[1], (3, 3, 4, 4)) / np.sqrt(36), "bias": jnp.zeros((4,))},
            "Dense_0": {"kernel": jax.random.normal(ks[2], (16, 5)) / 4.0, "bias": jnp.zeros((5,))}}


def _pin_loss(params, key):
    total = 0.0
    for i, p in enumerate(jax.tree_util.tree_leaves(params)):
        target = jax.random.normal(jax.random.fold_in(key, i), p.shape) * 0.3
        total = total + jnp.mean(jnp.tanh(p - target) ** 2) + 0.01 * jnp.sum(p ** 3) / p.size
    return 5.0 * total


@pytest.mark.slow
@pytest.mark.parametrize("name,model,horizon", sorted(PINNED))
def test_shipped_updates_match_the_numbers_pinned_before_the_parts(name, model, horizon):
    """Every shipped name was compared over 20 steps on this MLP and convnet at horizons 60 and 6000 before
    and after the rules became parts: bit for bit (40/40 cases). These four stay pinned."""
    import warnings
    import optax
    import lopt.pretrained
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 6000 steps is past the meta-training horizons: a warning, as documented
        tx = lopt.pretrained.load(name, num_steps=horizon, layout="cpu")
    params = _pin_mlp() if model == "mlp" else _pin_convnet()
    state, update, out = tx.init(params), jax.jit(lambda g, s, p, l: tx.update(g, s, p, loss=l)), []
    for t in range(20):
        loss, g = jax.value_and_grad(_pin_loss)(params, jax.random.key(t % 3))
        u, state = update(g, state, params, loss)
        out.append(np.concatenate([np.ravel(x) for x in jax.tree_util.tree_leaves(u)]))
        params = optax.apply_updates(params, u)
    first, total = PINNED[(name, model, horizon)]
    np.testing.assert_allclose(out[-1][:4], first, rtol=1e-6)
    np.testing.assert_allclose(float(np.abs(np.stack(out)).sum()), total, rtol=1e-6)

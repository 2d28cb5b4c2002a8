"""lopt.rules' parts, each wrapping optax.adamw (and Adam) with its constants given: the update is the
wrapped one's with the rule's math applied, and no more; and a part composed with a learned optimizer
equals the same rule built into its architecture."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lopt
import lopt.rules
from lopt.rules import depth, horizon, overshoot_brake, radial, schedule

LR = 1e-3


def mlp(depth_=2, width=8, scale=0.3, key=0):
    keys = jax.random.split(jax.random.key(key), depth_)
    return {f"Dense_{i}": {"kernel": jax.random.normal(k, (width, width)) * scale, "bias": jnp.zeros(width)}
            for i, k in enumerate(keys)}


def convnet():
    k1, k2 = jax.random.split(jax.random.key(1))
    return {"Conv_0": {"kernel": jax.random.normal(k1, (3, 3, 1, 4)) / 3.0, "bias": jnp.zeros(4)},
            "Dense_0": {"kernel": jax.random.normal(k2, (4, 10)) / 2.0, "bias": jnp.zeros(10)}}


def grads_at(params, i):
    return jax.tree_util.tree_map(lambda p: jnp.cos(3.0 * p + i + jnp.arange(p.size).reshape(p.shape)), params)


def run(tx, params, n=4, losses=None):
    """The updates of n steps (params moved by each, jitted), given loss losses[i] when losses is set."""
    state, p, out, update = tx.init(params), params, [], jax.jit(tx.update)
    for i in range(n):
        extra = {} if losses is None else {"loss": jnp.float32(losses[i])}
        u, state = update(grads_at(p, i), state, p, **extra)
        out.append(u)
        p = optax.apply_updates(p, u)
    return out


def first_updates(tx, params, i=0):
    """(tx's update, AdamW's update) at the same params and gradients, from fresh states."""
    g, plain = grads_at(params, i), optax.adamw(LR)
    return tx.update(g, tx.init(params), params)[0], plain.update(g, plain.init(params), params)[0]


def assert_times(u, v, factor):
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, factor * b, rtol=1e-6, atol=1e-12), u, v)


def test_scheduled_is_adamw_times_the_warmup_cosine():
    params, n = mlp(), 40
    tx, inner = lopt.rules.scheduled(optax.adamw(LR), num_steps=n), optax.adamw(LR)
    s, si, p = tx.init(params), inner.init(params), params
    for i in range(5):  # each step against AdamW's at the same params and state
        u, s = tx.update(grads_at(p, i), s, p)
        v, si = inner.update(grads_at(p, i), si, p)
        assert_times(u, v, float(schedule.prior_schedule("cosine", jnp.asarray(i), n)))
        p = optax.apply_updates(p, u)
    assert float(schedule.prior_schedule("cosine", jnp.asarray(0), n)) == 0.5  # warm-up of ⌈0.05 · 40⌉ = 2 steps


def test_horizon_scaled_is_one_up_to_the_reference_and_falls_past_it():
    for n, factor in ((1000, 1.0), (2000, 1.0), (8000, 0.25)):
        assert_times(*first_updates(lopt.rules.horizon_scaled(optax.adamw(LR), n, 2000, 1.0), mlp()), factor)
    assert float(horizon.horizon_scale(8000, 2000, 0.5)) == 0.5


def test_depth_scaled_scales_the_matrices_of_a_deep_model_only():
    for d, factor in ((3, 1.0), (6, 0.5)):
        params = mlp(depth_=d)
        u, v = first_updates(lopt.rules.depth_scaled(optax.adamw(LR), reference=3), params)
        for name in params:
            np.testing.assert_allclose(u[name]["kernel"], factor * v[name]["kernel"], rtol=1e-6)
            np.testing.assert_array_equal(u[name]["bias"], v[name]["bias"])
    assert depth.depth_scale(6, 3, 1.0) == 0.5


def test_conv_step_scaled_scales_a_convnet_and_leaves_an_mlp():
    for params, factor in ((convnet(), 3.0), (mlp(), 1.0)):
        assert_times(*first_updates(lopt.rules.conv_step_scaled(optax.adamw(LR), 3.0), params), factor)
    with pytest.raises(ValueError, match="conv_step_scale must be > 0"):
        lopt.rules.conv_step_scaled(optax.adamw(LR), 0.0)


def test_loss_aware_decay_is_adam_plus_eta_lambda_phi_p_on_matrices():
    """With the loss falling from 1 to 0.01, λ grows from λ₀ to λ₀ · clip(1 / (3 ℓ̄), 1, 10), ℓ̄ its EMA."""
    params, rate, losses = mlp(), 0.03, [1.0] + [0.01] * 24
    tx = lopt.rules.loss_aware_decay(optax.adam(LR), LR, rate, loss_free=3.0)
    state, si, p = tx.init(params), optax.adam(LR).init(params), params
    ema = None
    for i, loss in enumerate(losses):
        u, state = tx.update(grads_at(p, i), state, p, loss=loss)
        v, si = optax.adam(LR).update(grads_at(p, i), si, p)
        ema = loss if ema is None else ema
        ema = 0.9 * ema + 0.1 * loss
        lam = rate * min(max(1.0 / (3.0 * ema), 1.0), 10.0)
        for name in params:
            np.testing.assert_allclose(u[name]["kernel"], v[name]["kernel"] - LR * lam * p[name]["kernel"],
                                       rtol=1e-5, atol=1e-9)
            np.testing.assert_array_equal(u[name]["bias"], v[name]["bias"])
        p = optax.apply_updates(p, u)
    assert lam > 2 * rate  # the decay grew
    # without a loss it is AdamW's decoupled decay on the matrices, at λ₀
    tx = lopt.rules.loss_aware_decay(optax.adam(LR), LR, rate)
    u = tx.update(grads_at(params, 0), tx.init(params), params)[0]
    w = optax.adamw(LR, weight_decay=rate, mask=lambda ps: jax.tree_util.tree_map(lambda x: x.ndim == 2, ps))
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-10),
                           u, w.update(grads_at(params, 0), w.init(params), params)[0])


def test_growth_limited_removes_only_the_growing_part_of_large_matrices():
    small, large = mlp(scale=0.05), mlp(scale=2.0)  # rms · √8 ≈ 0.14 and ≈ 5.7 against g = 4
    for params, same in ((small, True), (large, False)):
        tx = lopt.rules.growth_limited(optax.adamw(LR), 4.0)
        g = jax.tree_util.tree_map(lambda p: -p, params)  # AdamW's step then grows every matrix
        u = tx.update(g, tx.init(params), params)[0]
        v = optax.adamw(LR).update(g, optax.adamw(LR).init(params), params)[0]
        for name in params:
            k, vk, p = u[name]["kernel"], v[name]["kernel"], params[name]["kernel"]
            assert np.array_equal(np.asarray(k), np.asarray(vk)) == same
            if not same:
                assert abs(float(jnp.vdot(k, p))) < 1e-6 * float(jnp.linalg.norm(vk) * jnp.linalg.norm(p))
            np.testing.assert_array_equal(u[name]["bias"], v[name]["bias"])
    assert radial.remove_growth(jnp.ones(4), jnp.ones(4)).tolist() == [1.0] * 4  # a shrinking residual is kept


def test_overshoot_brake_wraps_adamw_and_never_enlarges_its_steps():
    params = mlp()
    tx = overshoot_brake.overshoot_brake(optax.adamw(LR), gain=0.5)
    state, si, p = tx.init(params), optax.adamw(LR).init(params), params
    for i in range(4):
        g = jax.tree_util.tree_map(lambda x: (-1.0) ** i * jnp.ones_like(x), p)  # gradients flip: overshoot
        u, state = tx.update(g, state, p)
        v, si = optax.adamw(LR).update(g, si, p)
        alpha = float(jnp.exp(state.log_brake))
        jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, alpha * b, rtol=1e-6, atol=1e-12), u, v)
        p = optax.apply_updates(p, u)
    assert alpha < 1.0


def test_rules_compose_and_jit():
    params, n = mlp(depth_=4), 100
    tx = lopt.rules.depth_scaled(lopt.rules.horizon_scaled(lopt.rules.scheduled(
        lopt.rules.loss_aware_decay(optax.adam(LR), LR, 0.03), n), n, 50), reference=3)
    state = tx.init(params)
    u, state = jax.jit(tx.update)(grads_at(params, 0), state, params, loss=jnp.float32(1.0))
    assert all(np.all(np.isfinite(x)) for x in jax.tree_util.tree_leaves(u))


@pytest.mark.slow  # four Celo2LOpt compilations, 10-20 s each on a 2-core CPU
@pytest.mark.parametrize("option,part", [
    (dict(horizon_reference=2000, horizon_power=1.0),
     lambda tx, n: lopt.rules.horizon_scaled(tx, n, 2000, 1.0)),
    (dict(schedule="cosine"), lambda tx, n: lopt.rules.scheduled(tx, n)),
    (dict(conv_step_scale=3.0), lambda tx, n: lopt.rules.conv_step_scaled(tx, 3.0)),
    (dict(depth_reference=1, depth_power=1.0), lambda tx, n: lopt.rules.depth_scaled(tx, reference=1)),
])
def test_a_part_on_a_learned_optimizer_is_the_rule_its_architecture_builds_in(option, part):
    """Celo2LOpt with a step-size rule built in equals the plain Celo2LOpt wrapped in the rule's part,
    to float32 rounding (the factor multiplies the step instead of the step size), on a convnet."""
    base, theta = lopt.pretrained.load_learned_optimizer_by_name("celo2_v5")
    plain = dataclasses.replace(base, schedule="constant", horizon_reference=0)
    n, params = 4000, convnet()
    built_in = run(dataclasses.replace(plain, **option).opt_fn(theta, num_steps=n), params, n=2, losses=[1.0] * 2)
    composed = run(part(plain.opt_fn(theta, num_steps=n), n), params, n=2, losses=[1.0] * 2)
    for a, b in zip(built_in, composed):
        jax.tree_util.tree_map(lambda x, y: np.testing.assert_allclose(x, y, rtol=2e-5, atol=1e-9), a, b)

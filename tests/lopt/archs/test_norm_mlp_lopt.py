"""NormMLPLOpt: the numbers of its update rule (the common contract is in test_architectures.py)."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lopt

TINY = dict(hidden_size=4, lr_hidden_size=4, decays=(0.9,))


def _first_update(lo, theta, params, grads, **kw):
    tx = lo.opt_fn(theta, **kw)
    return tx.update(grads, tx.init(params), params)[0]


def test_fresh_theta_is_normalized_adam_at_base_lr():
    """With the residual MLP's output zeroed, a fresh theta's first step is −base_lr · sign(g)
    renormalized: Adam's first direction is g/|g| (bias-corrected), already of unit RMS."""
    lo = lopt.NormMLPLOpt(base_lr=0.01, **TINY)
    theta = lo.init(jax.random.key(0))
    theta["mlp"]["output"]["w"] = jnp.zeros_like(theta["mlp"]["output"]["w"])
    params = {"w": jnp.ones((4, 3)), "b": jnp.zeros((3,))}
    grads = {"w": jnp.arange(12.0).reshape(4, 3) - 5.5, "b": jnp.asarray([0.5, -2.0, 3.0])}
    u = _first_update(lo, theta, params, grads, num_steps=100)
    np.testing.assert_allclose(u["w"], -0.01 * np.sign(grads["w"]), rtol=1e-4)
    np.testing.assert_allclose(u["b"], -0.01 * np.sign(grads["b"]), rtol=1e-4)


def test_update_rms_is_the_learned_step_size_and_bounded():
    """Every learned-rule tensor's update has RMS η (before clipping binds); η stays inside
    [base_lr·e^−range, base_lr·e^range] however large the step-size head's output."""
    lo = lopt.NormMLPLOpt(base_lr=1e-3, log_lr_range=2.0, **TINY)
    theta = lo.init(jax.random.key(1))
    params = {"w": jax.random.normal(jax.random.key(2), (8, 6))}
    grads = {"w": jax.random.normal(jax.random.key(3), (8, 6))}
    u = _first_update(lo, theta, params, grads)
    np.testing.assert_allclose(float(jnp.sqrt(jnp.mean(u["w"] ** 2))), 1e-3, rtol=1e-3)
    for sign in (1.0, -1.0):
        big = jax.tree_util.tree_map(lambda x: x, theta)
        big["lr"]["output"]["b"] = jnp.full((2,), sign * 1e4)
        lrs = lo.step_sizes(big, jnp.asarray(0), None, jnp.zeros(2))
        np.testing.assert_allclose(lrs, 1e-3 * np.exp(sign * 2.0), rtol=1e-5)
        step = _first_update(lo, big, params, grads)["w"]
        assert float(jnp.abs(step).max()) <= 1e-3 * np.exp(sign * 2.0) * lo.clip_value * (1 + 1e-5)


def test_orthogonalize_gives_equal_singular_values_and_vector_rule_adam():
    """With `orthogonalize`, a matrix update's singular values are all close to one another (Newton–
    Schulz, optax's): without it, this gradient's first step (≈ sign(g)) has singular values spread
    over two orders of magnitude. With vector_rule="adam", a vector's first step is −η · sign(g),
    not renormalized."""
    lo = lopt.NormMLPLOpt(orthogonalize=True, vector_rule="adam", base_lr=0.1, **TINY)
    plain = lopt.NormMLPLOpt(base_lr=0.1, **TINY)
    theta = lo.init(jax.random.key(0))
    params = {"w": jnp.zeros((6, 4)), "b": jnp.zeros((2,))}
    g = jax.random.normal(jax.random.key(1), (6, 4))
    grads = {"w": g, "b": jnp.asarray([1e-3, -5.0])}
    s_ortho = jnp.linalg.svd(_first_update(lo, theta, params, grads)["w"], compute_uv=False)
    s_plain = jnp.linalg.svd(_first_update(plain, theta, params, grads)["w"], compute_uv=False)
    assert float(s_ortho[0] / s_ortho[-1]) < 2.0 and float(s_plain[0] / s_plain[-1]) > 50.0
    np.testing.assert_allclose(_first_update(lo, theta, params, grads)["b"], [-0.1, 0.1], rtol=1e-3)


def test_learns_step_size_schedule_inputs():
    """The step size depends on progress t/N (with use_num_steps) and ignores N without it."""
    theta = lopt.NormMLPLOpt(**TINY).init(jax.random.key(0))
    theta["lr"]["output"]["w"] = jnp.ones_like(theta["lr"]["output"]["w"])
    with_n, without_n = lopt.NormMLPLOpt(**TINY), lopt.NormMLPLOpt(use_num_steps=False, **TINY)
    t = jnp.asarray(50)
    assert not np.allclose(with_n.step_sizes(theta, t, 100, jnp.zeros(2)), with_n.step_sizes(theta, t, 1000, jnp.zeros(2)))
    np.testing.assert_array_equal(without_n.step_sizes(theta, t, 100, jnp.zeros(2)),
                                  without_n.step_sizes(theta, t, 1000, jnp.zeros(2)))


def test_fresh_theta_trains_a_quadratic_and_does_not_diverge_long():
    """A fresh theta is a small, safe optimizer: 4000 steps on an ill-conditioned quadratic
    reduce the loss by orders of magnitude and stay finite."""
    lo = lopt.NormMLPLOpt(**TINY)
    tx = lo.opt_fn(lo.init(jax.random.key(0)), num_steps=4000)
    scales = jnp.logspace(-2, 2, 20)
    loss_fn = lambda p: 0.5 * jnp.sum(scales * jnp.square(p["x"] - 1.0))
    params = {"x": jnp.zeros(20)}

    def step(carry, _):
        params, state = carry
        loss, g = jax.value_and_grad(loss_fn)(params)
        u, state = tx.update(g, state, params, loss=loss)
        return (optax.apply_updates(params, u), state), loss

    (params, _), losses = jax.jit(lambda c: jax.lax.scan(step, c, None, length=4000))((params, tx.init(params)))
    assert np.all(np.isfinite(losses))
    assert float(losses[-1]) < 1e-2 * float(losses[0])


@pytest.mark.parametrize("kwargs, match", [
    (dict(vector_rule="sgd"), "unknown vector_rule 'sgd'"),
    (dict(base_lr=0.0), "base_lr"),
    (dict(decays=(0.9, 1.0)), "decays"),
    (dict(hidden_layers=0), "hidden_layers"),
])
def test_bad_config_is_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        lopt.NormMLPLOpt(**kwargs)


def test_without_normalization_a_fresh_theta_is_adam():
    """normalize_update=False, residual zeroed: the updates of 3 steps are optax.adam(base_lr)'s
    (optax.scale_by_adam's bias-corrected m̂/(√v̂ + ε), β = 0.9, 0.999), the step-size head
    starting at exactly base_lr."""
    lo = lopt.NormMLPLOpt(base_lr=0.02, normalize_update=False, **TINY)
    theta = lo.init(jax.random.key(0))
    theta["mlp"]["output"]["w"] = jnp.zeros_like(theta["mlp"]["output"]["w"])
    ref = optax.adam(0.02, b1=0.9, b2=0.999, eps=1e-8)
    tx = lo.opt_fn(theta, num_steps=10)
    params = {"w": jax.random.normal(jax.random.key(5), (5, 3)), "b": jnp.zeros((3,))}
    s, r = tx.init(params), ref.init(params)
    for i in range(3):
        g = jax.tree_util.tree_map(lambda p: jnp.sin(3.0 * p + i) + 0.1 * i, params)
        u, s = tx.update(g, s, params)
        want, r = ref.update(g, r, params)
        np.testing.assert_allclose(u["w"], want["w"], rtol=2e-4, atol=1e-7)
        np.testing.assert_allclose(u["b"], want["b"], rtol=2e-4, atol=1e-7)
        params = optax.apply_updates(params, u)


def test_residual_bound_keeps_the_direction_near_adam():
    """With residual_bound B, however large the residual MLP's output, each element of the
    unnormalized direction stays within B of Adam's (here the first step: Adam's is sign(g))."""
    lo = lopt.NormMLPLOpt(base_lr=1.0, normalize_update=False, residual_bound=0.5, clip_value=100.0, **TINY)
    theta = lo.init(jax.random.key(0))
    theta["mlp"]["output"]["b"] = jnp.full((1,), 1e3)
    params = {"w": jax.random.normal(jax.random.key(6), (4, 4))}
    grads = {"w": jax.random.normal(jax.random.key(7), (4, 4))}
    u = _first_update(lo, theta, params, grads)["w"]
    np.testing.assert_allclose(-u, np.sign(grads["w"]) + 0.5, atol=1e-4)


def test_relative_step_and_cosine_prior_schedule():
    """relative_step scales each matrix's step by max(rms(p₀), floor), its RMS at init, fixed after
    (vectors take absolute steps); schedule="cosine" multiplies the step size by the warm-up-then-cosine
    σ(t, N): at t = 0 of N = 100, σ = 1/5 (5-step warm-up)."""
    lo = lopt.NormMLPLOpt(base_lr=0.1, normalize_update=False, relative_step=True, relative_floor=1e-2,
                          schedule="cosine", **TINY)
    theta = lo.init(jax.random.key(0))
    theta["mlp"]["output"]["w"] = jnp.zeros_like(theta["mlp"]["output"]["w"])
    params = {"w": jnp.full((4, 3), 2.0), "z": jnp.zeros((2, 2)), "b": jnp.zeros((3,))}
    grads = {"w": jnp.arange(12.0).reshape(4, 3) - 5.5, "z": jnp.ones((2, 2)), "b": jnp.asarray([0.5, -2.0, 3.0])}
    tx = lo.opt_fn(theta, num_steps=100)
    state = tx.init(params)
    u = tx.update(grads, state, params)[0]
    np.testing.assert_allclose(u["w"], -0.1 * 0.2 * 2.0 * np.sign(grads["w"]), rtol=1e-4)
    np.testing.assert_allclose(u["z"], -0.1 * 0.2 * 1e-2 * np.sign(grads["z"]), rtol=1e-4)  # the floor
    np.testing.assert_allclose(u["b"], -0.1 * 0.2 * np.sign(grads["b"]), rtol=1e-4)  # a vector: absolute
    # the scale is the one at init: weights grown 10x since do not grow the step
    grown = jax.tree_util.tree_map(lambda p: 10.0 * p + 1.0, params)
    np.testing.assert_allclose(tx.update(grads, state, grown)[0]["w"], u["w"], rtol=1e-4)
    sigma = [float(lo.prior_schedule(jnp.asarray(t), 100)) for t in (0, 4, 50, 100, 150)]
    np.testing.assert_allclose(sigma, [0.2, 1.0 * 0.5 * (1 + np.cos(np.pi * 0.04)), 0.5, 0.0, 0.0], atol=1e-6)
    assert float(lo.prior_schedule(jnp.asarray(7), None)) == 1.0  # no horizon: no schedule
    with pytest.raises(ValueError, match="unknown schedule 'linear'"):
        lopt.NormMLPLOpt(schedule="linear")
    with pytest.raises(ValueError, match="relative_floor"):
        lopt.NormMLPLOpt(relative_floor=0.0)


def test_fan_in_ref_gives_mup_steps():
    """With fan_in_ref c₀ a matrix's relative step is also scaled by √(c₀ / fan_in), fan_in from the
    leaf's role (lopt.param_roles; tests/lopt/test_param_roles.py checks every layer kind): a [4, 3]
    dense kernel at c₀ = 16 steps 2x, a [2, 2, 4, 5] conv kernel (fan_in 2·2·4 = 16) 1x; vectors stay
    absolute. Off (0), the steps are relative_step's alone."""
    kw = dict(base_lr=0.1, normalize_update=False, relative_step=True, relative_floor=1e-2, **TINY)
    params = {"w": jnp.full((4, 3), 2.0), "conv": {"w": jnp.full((2, 2, 4, 5), 0.5)}, "b": jnp.zeros((3,))}
    grads = jax.tree_util.tree_map(lambda p: jnp.ones_like(p), params)

    def first(lo):
        theta = lo.init(jax.random.key(0))
        theta["mlp"]["output"]["w"] = jnp.zeros_like(theta["mlp"]["output"]["w"])
        tx = lo.opt_fn(theta)
        return tx.update(grads, tx.init(params), params)[0]

    plain, mup = first(lopt.NormMLPLOpt(**kw)), first(lopt.NormMLPLOpt(fan_in_ref=16.0, **kw))
    np.testing.assert_allclose(plain["w"], -0.1 * 2.0, rtol=1e-4)
    np.testing.assert_allclose(mup["w"], -0.1 * 2.0 * 2.0, rtol=1e-4)
    np.testing.assert_allclose(mup["conv"]["w"], plain["conv"]["w"], rtol=1e-6)
    np.testing.assert_allclose(mup["conv"]["w"], -0.1 * 0.5, rtol=1e-4)
    np.testing.assert_allclose(mup["b"], plain["b"], rtol=1e-6)
    assert lopt.NormMLPLOpt(fan_in_ref=16.0, **kw).config()["fan_in_ref"] == 16.0
    with pytest.raises(ValueError, match="needs relative_step"):
        lopt.NormMLPLOpt(fan_in_ref=16.0)
    with pytest.raises(ValueError, match="fan_in_ref must be >= 0"):
        lopt.NormMLPLOpt(fan_in_ref=-1.0, relative_step=True)
    assert "fan_in_ref" not in lopt.NormMLPLOpt(**kw).config()  # configs written before it existed are unchanged


def _quadratic_run(lo, theta, curvature, steps=200):
    """(losses, log α per step: 0 without the brake) of `lo` on ½ Σ c_i w_i² + ½ Σ b_i², w₀ = b₀ = 1."""
    tx = lo.opt_fn(theta, num_steps=None)
    c = jnp.logspace(0, np.log10(curvature), 64).reshape(8, 8)
    params = {"w": jnp.ones((8, 8)), "b": jnp.ones((8,))}
    loss_fn = lambda p: 0.5 * jnp.sum(c * p["w"] ** 2) + 0.5 * jnp.sum(p["b"] ** 2)

    def step(carry, _):
        p, s = carry
        loss, g = jax.value_and_grad(loss_fn)(p)
        u, s = tx.update(g, s, p, loss=loss)
        return (optax.apply_updates(p, u), s), (loss, getattr(s, "log_brake", jnp.zeros(())))

    _, (losses, log_brake) = jax.jit(lambda c0: jax.lax.scan(step, c0, None, length=steps))((params, tx.init(params)))
    return np.asarray(losses), np.asarray(log_brake)


def test_overshoot_brake_engages_only_when_steps_overshoot():
    """overshoot_gain κ wraps the update in lopt.rules.overshoot_brake (tests/lopt/rules/test_overshoot_brake.py has
    its math). At a step size that oscillates on a stiff quadratic it engages and the loss ends far
    lower than without; where steps do not overshoot (a gentle quadratic, small steps) α stays 1 and the
    losses are bit-identical to the brake-less optimizer's."""
    kw = dict(TINY)  # normalized updates: without a brake, a too-large step oscillates at amplitude η for ever
    off, on = lopt.NormMLPLOpt(base_lr=0.3, **kw), lopt.NormMLPLOpt(base_lr=0.3, overshoot_gain=0.5, **kw)
    theta = off.init(jax.random.key(0))
    theta["mlp"]["output"]["w"] = jnp.zeros_like(theta["mlp"]["output"]["w"])
    loss_off, _ = _quadratic_run(off, theta, 100.0)
    loss_on, log_brake = _quadratic_run(on, theta, 100.0)
    assert log_brake.min() < np.log(0.1) and log_brake.max() <= 0.0 and log_brake.min() >= np.log(0.01) - 1e-6
    assert loss_on[-20:].mean() < 0.05 * loss_off[-20:].mean()  # measured: 0.74 vs 29.4
    small_off, small_on = (lopt.NormMLPLOpt(base_lr=1e-3, **kw), lopt.NormMLPLOpt(base_lr=1e-3, overshoot_gain=0.5, **kw))
    l0, _ = _quadratic_run(small_off, theta, 2.0)
    l1, lb = _quadratic_run(small_on, theta, 2.0)
    np.testing.assert_array_equal(lb, 0.0)
    np.testing.assert_array_equal(l0, l1)
    assert isinstance(off.opt_fn(theta).init({"w": jnp.ones(3)}), lopt.NormMLPLOptState)  # off: no extra state
    assert "overshoot_gain" not in off.config() and on.config()["overshoot_gain"] == 0.5
    for bad in (dict(overshoot_gain=-1.0), dict(overshoot_threshold=1.0)):
        with pytest.raises(ValueError, match="overshoot"):
            lopt.NormMLPLOpt(**bad)


@pytest.mark.parametrize("shape", [(5, 3), (130, 131)])  # one block; two overlapping blocks of norm_mlp_lopt.BLOCK
def test_residual_is_the_mlp_of_rms_normalised_features(shape):
    """The learned residual equals the direct computation: the F features of every element
    (g, p, m_k, √v, g/√(v+ε), m_0.9/√(v+ε)), each divided by its RMS over the tensor, through the
    ReLU MLP whose first-layer bias is b + emb(t) W_time. normalize_update=False and a fresh
    step-size head make the step −base_lr · (adam + r), so r is read back from the update."""
    from lopt.parts import features as ft
    from lopt.archs.norm_mlp_lopt import BLOCK
    assert (shape[0] * shape[1] > BLOCK) == (shape == (130, 131))
    lo = lopt.NormMLPLOpt(base_lr=0.01, normalize_update=False, clip_value=1e6, hidden_layers=2, decays=(0.5, 0.9))
    theta = lo.init(jax.random.key(0))
    mlp = theta["mlp"]
    mlp["output"]["w"] = jax.random.normal(jax.random.key(1), mlp["output"]["w"].shape)
    mlp["input"]["b"] = 0.1 * jax.random.normal(jax.random.key(2), mlp["input"]["b"].shape)
    p = jax.random.normal(jax.random.key(3), shape)
    g = jax.random.normal(jax.random.key(4), shape) * jnp.linspace(0.1, 3.0, shape[1])
    u = _first_update(lo, theta, {"w": p}, {"w": g})["w"]

    m = jnp.stack([(1 - b) * g for b in (0.5, 0.9)])                       # one step from zero
    v = (1 - 0.999) * jnp.square(g)
    adam = (m[1] / 0.1) / (jnp.sqrt(v / 0.001) + 1e-8)
    rs = jax.lax.rsqrt(v + ft.EPS)
    feats = [g, p, m[0], m[1], jnp.sqrt(v), g * rs, m[1] * rs]
    x = jnp.stack([f / jnp.sqrt(jnp.mean(jnp.square(f)) + ft.EPS) for f in feats], axis=-1)  # [*shape, F]
    bias = mlp["input"]["b"] + ft.step_embedding(jnp.asarray(0), lo.timescales) @ mlp["input"]["w_time"]
    h = jax.nn.relu(x @ mlp["input"]["w"] + bias)
    h = jax.nn.relu(h @ mlp["hidden_1"]["w"] + mlp["hidden_1"]["b"])
    r = (h @ mlp["output"]["w"] + mlp["output"]["b"])[..., 0]
    assert float(jnp.std(r)) > 0.1  # the residual matters in this check
    np.testing.assert_allclose(-u / 0.01, adam + r, rtol=1e-4, atol=1e-4)


def test_shipped_v3_loads_with_the_brake_and_v2_without():
    """`lopt.pretrained.load` applies its rule chain: normmlp_v3's brake (overshoot_gain 0.2) on top of
    the saved config (`load_learned_optimizer_by_name` keeps the config as meta-trained); normmlp_v2 as saved."""
    import lopt.pretrained as pre
    saved, _ = pre.load_learned_optimizer_by_name("normmlp_v3")
    deployed, _ = pre.deployed_learned_optimizer("normmlp_v3")
    assert saved.overshoot_gain == 0.0 and deployed.overshoot_gain == 0.2
    assert {k: v for k, v in deployed.config().items() if k != "overshoot_gain"} == saved.config()
    assert pre.info("normmlp_v3")["rules"] == [{"part": "overshoot_brake", "gain": 0.2, "threshold": 0.15}]
    assert pre.info("normmlp_v3")["deploy_options"] == {} and pre.deploy_options("normmlp_v2") == {}
    params = {"w": jnp.ones((4, 3))}
    assert hasattr(pre.load("normmlp_v3", num_steps=10).init(params), "log_brake")
    assert isinstance(pre.load("normmlp_v2", num_steps=10).init(params), lopt.NormMLPLOptState)


@pytest.mark.slow
def test_deployed_v3_brakes_on_the_digits_autoencoder():
    """On the 64-32-8-32-64 ReLU autoencoder of digits (MSE, batch 64, horizon 1500), where the shipped
    normmlp_v3's learned step overshoots after its warm-up (docs/pretrained.md), the brake engages:
    α < 0.5 within 300 steps (measured 0.2 at step 100, ~0.1 from step 200)."""
    import haiku as hk
    import lopt.pretrained
    from tasks import registry
    data = registry.get_dataset("digits", 64)

    def net(x):
        x = x.reshape(x.shape[0], -1)
        for h in (32, 8, 32):
            x = jax.nn.relu(hk.Linear(h)(x))
        return hk.Linear(64)(x)

    model = hk.without_apply_rng(hk.transform(net))
    loss_fn = lambda p, x: jnp.mean(jnp.square(model.apply(p, x) - x.reshape(x.shape[0], -1)))
    tx = lopt.pretrained.load("normmlp_v3", num_steps=1500)
    x0 = data.batch(jax.random.key(0), "train")["image"].astype(jnp.float32)
    params = model.init(jax.random.key(0), x0)

    def step(carry, key):
        p, s = carry
        x = data.batch(key, "train")["image"].astype(jnp.float32)
        loss, g = jax.value_and_grad(loss_fn)(p, x)
        u, s = tx.update(g, s, p, loss=loss)
        return (optax.apply_updates(p, u), s), (loss, s.log_brake)

    _, (losses, log_brake) = jax.jit(lambda c: jax.lax.scan(step, c, jax.random.split(jax.random.key(1), 300)))(
        (params, tx.init(params)))
    assert np.all(np.isfinite(losses)) and float(log_brake[-1]) < np.log(0.5), np.exp(log_brake[::50])

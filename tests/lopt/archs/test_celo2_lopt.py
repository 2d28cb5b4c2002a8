"""Celo2LOpt's numbers: a fresh theta is optax's Muon + Adam, the matrix step's spectral norm is
η·√max(1, fan_out/fan_in) whatever the theta, roles route leaves, and the learned parts act."""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lopt
from lopt import param_roles
from lopt.parts import newton_schulz
from lopt.parts.newton_schulz import is_orthogonalized
from lopt.rules.depth import matrix_depth
from lopt.rules import schedule
from lopt.rules import horizon


def _params():
    ks = jax.random.split(jax.random.key(0), 4)
    return {"hidden": {"kernel": jax.random.normal(ks[0], (12, 20)) * 0.3, "bias": jnp.zeros((20,))},
            "out": {"kernel": jax.random.normal(ks[1], (20, 6)) * 0.2, "bias": jax.random.normal(ks[2], (6,))}}


def _grads(params, i):
    return jax.tree_util.tree_map(lambda p: jnp.cos(3.0 * p + i) + 0.05 * (i + 1), params)


def _run(tx, params, n=4, loss=True):
    state, outs = tx.init(params), []
    step = jax.jit(lambda g, s, p, l: tx.update(g, s, p, **({"loss": l} if loss else {})))
    for i in range(n):
        u, state = step(_grads(params, i), state, params, jnp.asarray(1.0 / (i + 1)))
        params = optax.apply_updates(params, u)
        outs.append(u)
    return outs


def _spectral(x):
    return float(np.linalg.norm(np.asarray(x, np.float64), 2))


def test_fresh_theta_without_residual_is_optax_muon_with_adam_for_vectors():
    lo = lopt.Celo2LOpt(residual_init=0.0, matrix_lr=0.03, adam_lr=2e-3)
    theta = lo.init(jax.random.key(1))
    muon = optax.contrib.muon(learning_rate=0.03, beta=0.95, adam_b1=0.95, adam_b2=0.999,
                              adam_learning_rate=2e-3)
    ours, ref = _run(lo.opt_fn(theta, num_steps=50), _params()), _run(muon, _params(), loss=False)
    for a, b in zip(ours, ref):
        chex.assert_trees_all_close(a, b, rtol=2e-4, atol=1e-7)
    assert float(jnp.abs(ours[0]["hidden"]["kernel"]).max()) > 1e-3  # a real step, not zeros


def test_matrix_step_has_the_mu_p_spectral_norm_for_any_theta():
    """Random, large theta (learned direction far from Muon's, step-size head at its bound):
    ‖Δ‖₂ / (η_matrix · √max(1, fan_out/fan_in)) stays at Newton–Schulz's ~1."""
    lo = lopt.Celo2LOpt()
    theta = jax.tree_util.tree_map(lambda x: 5.0 * jax.random.normal(jax.random.key(7), x.shape), lo.init(jax.random.key(2)))
    tx = lo.opt_fn(theta, num_steps=100)
    params = _params()
    u, _ = jax.jit(lambda g, s, p: tx.update(g, s, p, loss=jnp.asarray(0.5)))(_grads(params, 0), tx.init(params), params)
    eta = float(lo.step_sizes(theta, jnp.zeros((), jnp.int32), 100, jnp.asarray([1.0, 0.0]))[0])
    assert lo.matrix_lr * np.exp(-3.0) <= eta <= lo.matrix_lr * np.exp(3.0)
    for name, (fan_in, fan_out) in {"hidden": (12, 20), "out": (20, 6)}.items():
        ratio = _spectral(u[name]["kernel"]) / (eta * np.sqrt(max(1.0, fan_out / fan_in)))
        assert 0.6 < ratio < 1.3, (name, ratio)


def test_learned_direction_changes_the_update_and_is_differentiable():
    lo = lopt.Celo2LOpt(residual_init=1.0)
    theta = lo.init(jax.random.key(3))
    params = _params()
    muonlike = lopt.Celo2LOpt(residual_init=0.0)
    a = _run(lo.opt_fn(theta), params, n=2)[-1]["hidden"]["kernel"]
    b = _run(muonlike.opt_fn(muonlike.init(jax.random.key(3))), params, n=2)[-1]["hidden"]["kernel"]
    cos = float(jnp.sum(a * b) / (jnp.linalg.norm(a) * jnp.linalg.norm(b)))
    assert 0.0 < cos < 0.99  # another direction, still a descent-like one

    def meta_loss(th):
        tx = lo.opt_fn(th, num_steps=10)
        u, _ = tx.update(_grads(params, 0), tx.init(params), params, loss=jnp.asarray(1.0))
        return jnp.sum(optax.apply_updates(params, u)["hidden"]["kernel"] ** 2)

    g = jax.jit(jax.grad(meta_loss))(theta)  # jitted: op-by-op differentiation of the update takes ~10x longer
    assert float(jnp.abs(g["mlp"]["input"]["w"]).sum()) > 0 and float(jnp.abs(g["lr"]["output"]["w"]).sum()) > 0


def test_conv_and_attention_kernels_are_orthogonalized_over_their_input_axes():
    lo = lopt.Celo2LOpt(residual_init=0.0)
    ks = jax.random.split(jax.random.key(4), 2)
    params = {"conv1": {"kernel": jax.random.normal(ks[0], (3, 3, 4, 8))},
              "query": {"kernel": jax.random.normal(ks[1], (16, 2, 4))}}
    u = _run(lo.opt_fn(lo.init(jax.random.key(0))), params, n=1)[0]
    conv = np.asarray(u["conv1"]["kernel"]).reshape(36, 8)  # inputs: 3·3·4, outputs 8
    query = np.asarray(u["query"]["kernel"]).reshape(16, 8)  # inputs: d_model 16, outputs 2·4
    for mat in (conv, query):
        s = np.linalg.svd(mat / lo.matrix_lr, compute_uv=False)  # width scale 1: fan_out ≤ fan_in
        assert s.min() > 0.5 and s.max() < 1.3, s
    assert newton_schulz.width_scale((8, 32), param_roles.MATRIX) == 2.0
    assert newton_schulz.width_scale((3, 3, 4, 8), param_roles.matrix((0, 1, 2))) == 1.0


def test_roles_route_leaves_between_the_learned_and_the_adamw_paths():
    assert is_orthogonalized(param_roles.MATRIX, (4, 5))
    assert not is_orthogonalized(param_roles.MATRIX, (4, 1)) and not is_orthogonalized(param_roles.VECTOR, (4, 5))
    assert not is_orthogonalized(param_roles.EMBEDDING, (10, 4))
    lo = lopt.Celo2LOpt(adam_lr=1e-2)
    theta = lo.init(jax.random.key(0))
    params = {"embed": {"embedding": jnp.ones((10, 4))}, "head": {"kernel": jnp.ones((4, 3))}}
    g = {"embed": {"embedding": jnp.full((10, 4), 0.5)}, "head": {"kernel": jnp.full((4, 3), 0.5)}}
    as_embedding = {"embed": None, "head": param_roles.EMBEDDING}  # an output layer given AdamW
    tx = lo.opt_fn(theta, weight_dimension_numbers=as_embedding)
    u, _ = tx.update(g, tx.init(params), params)
    # NAdam's first step is lr · (1 + β/(1 + β)) · sign(g) (up to ε), for the embedding and the marked head alike
    first = -1e-2 * (1.0 + 0.95 / 1.95)
    chex.assert_trees_all_close(u, jax.tree_util.tree_map(lambda x: jnp.full(x.shape, first), g), rtol=1e-5)


def test_decoupled_weight_decay_is_lr_times_lambda_times_p():
    wd, lr = 0.1, 1e-2
    params = {"bias": jnp.full((5,), 2.0), "w": jnp.eye(4) * 3.0}
    zero = jax.tree_util.tree_map(jnp.zeros_like, params)
    with_wd, without = (lopt.Celo2LOpt(adam_lr=lr, matrix_lr=lr, weight_decay=w, residual_init=0.0) for w in (wd, 0.0))
    ua, _ = with_wd.opt_fn(with_wd.init(jax.random.key(0))).update(zero, with_wd.opt_fn(with_wd.init(jax.random.key(0))).init(params), params)
    ub, _ = without.opt_fn(without.init(jax.random.key(0))).update(zero, without.opt_fn(without.init(jax.random.key(0))).init(params), params)
    chex.assert_trees_all_close(jax.tree_util.tree_map(lambda a, b: a - b, ua, ub),
                                jax.tree_util.tree_map(lambda p: -lr * wd * p, params), rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("shape, role", [((4,), param_roles.VECTOR), ((5, 5, 5), param_roles.matrix((0, 1, 2)))])
def test_dimension_numbers_refuse_leaves_that_are_not_matrices(shape, role):
    with pytest.raises(ValueError, match="orthogonalized|no output axis"):
        newton_schulz.dimension_numbers(role, len(shape))


def test_cosine_schedule_scales_both_step_sizes_and_leaves_celo2_v1_configs_unchanged():
    """With schedule="cosine" each step is the constant schedule's times σ(t, N) (the Adam path
    exactly, the orthogonalized one up to Newton–Schulz's normalisation); "constant" stays out of config()."""
    from lopt.parts import features as ft
    const, cos = lopt.Celo2LOpt(), lopt.Celo2LOpt(schedule="cosine")
    assert "schedule" not in const.config() and cos.config()["schedule"] == "cosine"
    theta = const.init(jax.random.key(0))
    params = _params()
    n = 40
    a, b = _run(const.opt_fn(theta, num_steps=n), params, n=3), _run(cos.opt_fn(theta, num_steps=n), params, n=3)
    for t in range(3):
        sigma = float(schedule.prior_schedule("cosine", jnp.asarray(t), n))
        assert sigma < 1.0
        # the first step moves params identically; later steps see different params, so compare step 0 only
        if t == 0:
            chex.assert_trees_all_close(b[0], jax.tree_util.tree_map(lambda x: sigma * x, a[0]), rtol=2e-5, atol=1e-9)
    assert float(schedule.prior_schedule("cosine", jnp.asarray(n), n)) == 0.0


@pytest.mark.slow  # the horizon/depth rules also have fast tests in tests/lopt/rules
def test_horizon_factor_scales_steps_past_the_reference_only():
    """horizon_reference N_ref: a run of N ≤ N_ref steps is the same as without it (bit for bit);
    past N_ref every step is (N_ref/N)^α of it, on both paths; the default stays out of config()."""
    from lopt.parts import features as ft
    base, hz = lopt.Celo2LOpt(schedule="cosine"), lopt.Celo2LOpt(schedule="cosine", horizon_reference=100,
                                                                horizon_power=0.5)
    assert "horizon_reference" not in base.config() and hz.config()["horizon_reference"] == 100
    theta = base.init(jax.random.key(0))
    params = _params()
    for n in (40, 100):
        chex.assert_trees_all_equal(_run(base.opt_fn(theta, num_steps=n), params, n=2),
                                    _run(hz.opt_fn(theta, num_steps=n), params, n=2))
    n = 400
    a, b = _run(base.opt_fn(theta, num_steps=n), params, n=1), _run(hz.opt_fn(theta, num_steps=n), params, n=1)
    chex.assert_trees_all_close(b[0], jax.tree_util.tree_map(lambda x: 0.5 * x, a[0]), rtol=2e-5, atol=1e-9)
    np.testing.assert_allclose(float(horizon.horizon_scale(10_000, 2000, 1.0)), 0.2, rtol=1e-6)
    assert float(horizon.horizon_scale(None, 2000, 1.0)) == 1.0 == float(horizon.horizon_scale(50_000, 0, 0.5))
    with pytest.raises(ValueError, match="horizon_reference"):
        lopt.Celo2LOpt(horizon_reference=-1)
    with pytest.raises(ValueError, match="horizon_power"):
        lopt.Celo2LOpt(horizon_reference=10, horizon_power=-0.5)
    with pytest.raises(ValueError, match="residual_horizon_power"):
        lopt.Celo2LOpt(horizon_reference=10, residual_horizon_power=-1.0)


@pytest.mark.slow  # the horizon/depth rules also have fast tests in tests/lopt/rules
def test_residual_horizon_power_scales_the_learned_residual_past_the_reference():
    """residual_horizon_power β: past N_ref the update is the one whose theta has the MLP's output layer
    times (N_ref/N)^β (the residual is linear in it); up to N_ref it is the update without the option."""
    plain = lopt.Celo2LOpt(residual_init=1.0)
    fading = lopt.Celo2LOpt(residual_init=1.0, horizon_reference=100, horizon_power=0.0, residual_horizon_power=1.0)
    theta = plain.init(jax.random.key(3))
    scaled = jax.tree_util.tree_map(lambda x: x, theta)
    scaled["mlp"]["output"] = jax.tree_util.tree_map(lambda x: 0.25 * x, theta["mlp"]["output"])
    params = _params()
    chex.assert_trees_all_close(_run(fading.opt_fn(theta, num_steps=400), params, n=3),
                                _run(plain.opt_fn(scaled, num_steps=400), params, n=3), rtol=2e-5, atol=1e-7)
    chex.assert_trees_all_equal(_run(fading.opt_fn(theta, num_steps=100), params, n=2),
                                _run(plain.opt_fn(theta, num_steps=100), params, n=2))
    # the residual matters at this theta, so the comparison above can fail
    assert not np.allclose(_run(plain.opt_fn(theta, num_steps=400), params, n=1)[0]["hidden"]["kernel"],
                           _run(plain.opt_fn(scaled, num_steps=400), params, n=1)[0]["hidden"]["kernel"], atol=1e-4)


def _radial_theta(learned_opt, sign):
    """A theta whose residual is r = sign · p / rms(p): hidden units relu(±p̃), output their difference."""
    theta = learned_opt.init(jax.random.key(4))
    mlp, h = theta["mlp"], learned_opt.hidden_size
    p_index = 1  # the features' order: g, p, m_1..m_K, ...
    w_in = jnp.zeros_like(mlp["input"]["w"]).at[p_index, 0].set(1.0).at[p_index, 1].set(-1.0)
    mlp["input"] = {"w": w_in, "b": jnp.zeros_like(mlp["input"]["b"])}
    mlp["hidden_1"] = {"w": jnp.eye(h), "b": jnp.zeros((h,))}
    mlp["output"] = {"w": jnp.zeros((h, 1)).at[0, 0].set(sign).at[1, 0].set(-sign), "b": jnp.zeros((1,))}
    return theta


@pytest.mark.slow  # heavy; the fast tier keeps a smaller check of the same part
def test_residual_no_growth_removes_a_residual_that_only_grows_the_weights():
    """r = −p̃ (the step −η·orth(b̂ + r) pushes every matrix outwards): with the option the residual is
    projected to 0 and the update is the residual-free one (Muon's direction); r = +p̃ (shrinks) is kept."""
    plain, no_growth = lopt.Celo2LOpt(hidden_layers=2), lopt.Celo2LOpt(hidden_layers=2, residual_no_growth=True)
    assert "residual_no_growth" not in plain.config()  # off: configs saved before the option load unchanged
    params, growing, shrinking = _params(), _radial_theta(plain, -1.0), _radial_theta(plain, 1.0)
    muon = jax.tree_util.tree_map(lambda x: x, growing)
    muon["mlp"]["output"] = jax.tree_util.tree_map(jnp.zeros_like, growing["mlp"]["output"])
    chex.assert_trees_all_close(_run(no_growth.opt_fn(growing, num_steps=50), params, n=3),
                                _run(plain.opt_fn(muon, num_steps=50), params, n=3), rtol=1e-4, atol=1e-6)
    chex.assert_trees_all_close(_run(no_growth.opt_fn(shrinking, num_steps=50), params, n=3),
                                _run(plain.opt_fn(shrinking, num_steps=50), params, n=3), rtol=1e-6, atol=1e-8)
    # without the option the growing residual changes the matrix update, so the first comparison can fail
    grown = _run(plain.opt_fn(growing, num_steps=50), params, n=1)[0]["hidden"]["kernel"]
    assert not np.allclose(grown, _run(plain.opt_fn(muon, num_steps=50), params, n=1)[0]["hidden"]["kernel"],
                           atol=1e-4)
    # and it grows the weights: the step has a positive component along p, which the option removes
    p = params["hidden"]["kernel"]
    assert float(jnp.sum(grown * p)) > 0


def _deep_params(depth):
    ks = jax.random.split(jax.random.key(5), depth)
    return {f"layer_{i}": {"kernel": jax.random.normal(k, (10, 10)) * 0.3, "bias": jnp.zeros((10,))}
            for i, k in enumerate(ks)}


@pytest.mark.slow  # the horizon/depth rules also have fast tests in tests/lopt/rules
def test_depth_factor_scales_matrix_steps_of_deeper_models_only():
    """depth_reference D_ref, depth_power γ: a model of D ≤ D_ref orthogonalized tensors steps as
    without the option (bit for bit); with D = 6 > D_ref = 3 every matrix step is (3/6)^γ of it and
    the biases' (Adam path) are unchanged; the default stays out of config(); bad options are refused."""
    base, deep = lopt.Celo2LOpt(), lopt.Celo2LOpt(depth_reference=3, depth_power=0.5)
    assert "depth_reference" not in base.config() and deep.config()["depth_reference"] == 3
    theta = base.init(jax.random.key(0))
    shallow = _deep_params(3)
    chex.assert_trees_all_equal(_run(base.opt_fn(theta), shallow, n=2), _run(deep.opt_fn(theta), shallow, n=2))
    params = _deep_params(6)
    a, b = _run(base.opt_fn(theta), params, n=1)[0], _run(deep.opt_fn(theta), params, n=1)[0]
    for name in params:
        np.testing.assert_allclose(b[name]["kernel"], 0.5 ** 0.5 * a[name]["kernel"], rtol=2e-5, atol=1e-9)
        chex.assert_trees_all_equal(b[name]["bias"], a[name]["bias"])
    assert deep.depth_scale(3) == 1.0 and deep.depth_scale(12) == 0.5 and base.depth_scale(100) == 1.0
    with pytest.raises(ValueError, match="depth_reference"):
        lopt.Celo2LOpt(depth_reference=-1)
    with pytest.raises(ValueError, match="depth_power"):
        lopt.Celo2LOpt(depth_reference=3, depth_power=-1.0)


def test_matrix_depth_counts_the_orthogonalized_tensors():
    """D counts dense and conv kernels, not biases, norm scales, [n, 1] "matrices" or embeddings."""
    params = {"embed": {"embedding": jnp.zeros((50, 8))}, "conv": {"kernel": jnp.zeros((3, 3, 1, 4))},
              "dense": {"kernel": jnp.zeros((8, 8)), "bias": jnp.zeros((8,))}, "norm": {"scale": jnp.ones((8,))},
              "head": {"kernel": jnp.zeros((8, 1))}}
    roles = param_roles.infer(params)
    leaves = jax.tree_util.tree_leaves(params)
    role_leaves = jax.tree_util.tree_leaves(roles, is_leaf=lambda x: isinstance(x, param_roles.ParamRole))
    assert matrix_depth([x.shape for x in leaves], role_leaves) == 2


def test_residual_growth_free_needs_the_rule_and_is_non_negative():
    with pytest.raises(ValueError, match="residual_growth_free needs residual_no_growth"):
        lopt.Celo2LOpt(residual_growth_free=2.0)
    with pytest.raises(ValueError, match="residual_growth_free must be >= 0"):
        lopt.Celo2LOpt(residual_no_growth=True, residual_growth_free=-1.0)


def test_conv_step_scale_multiplies_every_step_of_a_model_with_a_conv_kernel():
    """conv_step_scale c: in a model with a conv kernel every first update (the conv kernel's, the dense
    head's, the bias's, the decay included) is c times the one without, bit for bit at c = 2; a model
    without a conv kernel steps as before."""
    rng = np.random.RandomState(0)
    convnet = {"Conv_0": {"kernel": rng.randn(3, 3, 2, 4).astype(np.float32)},
               "Dense_0": {"kernel": rng.randn(4, 3).astype(np.float32), "bias": rng.randn(3).astype(np.float32)}}
    mlp = {"Dense_0": convnet["Dense_0"]}
    theta = lopt.Celo2LOpt().init(jax.random.key(0))

    def update(params, **options):
        grads = jax.tree_util.tree_map(lambda p: np.cos(np.arange(p.size, dtype=np.float32)).reshape(p.shape), params)
        tx = lopt.Celo2LOpt(wd_rate=0.2, **options).opt_fn(theta)
        return jax.tree_util.tree_map(np.asarray, tx.update(grads, tx.init(params), params, loss=1.0)[0])

    plain, scaled = update(convnet), update(convnet, conv_step_scale=2.0)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_array_equal(b, 2.0 * a), plain, scaled)
    jax.tree_util.tree_map(np.testing.assert_array_equal, update(mlp), update(mlp, conv_step_scale=2.0))
    with pytest.raises(ValueError, match="conv_step_scale must be > 0"):
        lopt.Celo2LOpt(conv_step_scale=0.0)

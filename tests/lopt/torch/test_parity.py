"""lopt.torch computes the JAX transform's update: parity for every architecture and shipped optimizer.

Both sides are fed the same 100 gradients and losses (float32 on both sides) on a tree of a dense
kernel, a bias and a 4-D conv kernel; the torch parameters are in torch's layout (the dense kernel
transposed, the conv kernel [out, in, kh, kw]), so a rule that read the wrong axes (factored
statistics, fan-in) would fail. Two errors are measured per tensor after 100 steps:

- relative to the parameters: max |p_torch − p_jax| / max |p_jax|, required ≤ 1e-5 (measured ≤ ~3e-7;
  ≤ ~4e-7 for Celo2LOpt, whose Newton–Schulz iteration amplifies rounding: optax's own float32
  orthogonalization is ~1e-6 from float64's);
- relative to the distance travelled: max |p_torch − p_jax| / max |p_jax − p_0|, a much stricter
  measure because the updates are small next to the weights; required ≤ 1e-4 (measured ≤ ~6e-6;
  ≤ ~1.2e-5 for Celo, whose learned scheduler's loss features amplify rounding).
  The two float32 programs differ in rounding only (XLA's and torch's tanh, exp, pow, matmul and
  summation orders differ in the last bit).
"""
from __future__ import annotations

import hashlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

torch = pytest.importorskip("torch", reason='PyTorch is not installed: pip install -e ".[torch]"')

import lopt  # noqa: E402
import lopt.torch as lt  # noqa: E402
from tests.fixtures import torch_architectures, single_torch_thread

SHAPES = {"dense_w": (5, 7), "dense_b": (7,), "conv_w": (3, 2, 4, 6)}  # JAX layout: [in, out], [kh, kw, in, out]
STEPS = 100
PARAM_TOL, TRAVEL_TOL = 1e-5, 1e-4


one_torch_thread = pytest.fixture(autouse=True)(single_torch_thread)


def perturbed(theta, key, rel=0.2):
    """theta plus noise of rel · max(rms(leaf), 0.1) per leaf, so that no output layer is zero."""
    leaves, treedef = jax.tree_util.tree_flatten(theta)
    out = []
    for k, x in zip(jax.random.split(key, len(leaves)), leaves):
        x = jnp.asarray(x)
        scale = max(float(jnp.sqrt(jnp.mean(jnp.square(x)))), 0.1)
        out.append(x + rel * scale * jax.random.normal(k, x.shape, x.dtype))
    return treedef.unflatten(out)


def problem(seed=0, steps=STEPS):
    """(initial params, gradients per step, losses per step), numpy float32 in JAX layout."""
    rng = np.random.RandomState(seed)
    params = {k: (rng.randn(*s) * 0.5).astype(np.float32) for k, s in SHAPES.items()}
    grads = [{k: (rng.randn(*s) * (0.1 + 0.05 * np.sin(t))).astype(np.float32) for k, s in SHAPES.items()}
             for t in range(steps)]
    losses = (2.0 * np.exp(-np.arange(steps) / 50) + 0.05 * rng.rand(steps)).astype(np.float32)
    return params, grads, losses


_REFERENCES: dict = {}


def run_jax(learned_opt, theta, num_steps, params, grads, losses, pass_loss=True):
    """The JAX transform's parameters after the steps (cached: several tests share a reference run)."""
    digest = hashlib.sha256(b"".join(np.asarray(x).tobytes() for x in jax.tree_util.tree_leaves(theta)))
    key = (repr(learned_opt), digest.hexdigest(), num_steps, len(grads), pass_loss)
    if key not in _REFERENCES:
        _REFERENCES[key] = _run_jax(learned_opt, theta, num_steps, params, grads, losses, pass_loss)
    return _REFERENCES[key]


def _run_jax(learned_opt, theta, num_steps, params, grads, losses, pass_loss):
    tx = learned_opt.opt_fn(theta, num_steps=num_steps)
    update = jax.jit(tx.update)
    p = jax.tree_util.tree_map(jnp.asarray, params)
    state = tx.init(p)
    for g, loss in zip(grads, losses):
        updates, state = update(g, state, p, **({"loss": loss} if pass_loss else {}))
        p = optax.apply_updates(p, updates)
    return {k: np.asarray(v) for k, v in p.items()}


def run_torch(source, num_steps, params, grads, losses, pass_loss=True, layout="torch", **options):
    tp = {k: torch.nn.Parameter(lt.from_jax(v, layout)) for k, v in params.items()}
    opt = lt.optimizer(source, list(tp.values()), num_steps=num_steps, require_loss=pass_loss, layout=layout,
                       **options)
    for g, loss in zip(grads, losses):
        for k, p in tp.items():
            p.grad = lt.from_jax(g[k], layout)
        opt.step(loss=float(loss)) if pass_loss else opt.step()
    return {k: lt.to_jax(p.detach(), layout) for k, p in tp.items()}


def errors(jax_params, torch_params, initial):
    """{leaf: (error relative to the parameters, error relative to the distance travelled)}."""
    out = {}
    for k, a in jax_params.items():
        a, b = a.astype(np.float64), torch_params[k].astype(np.float64)
        diff = np.max(np.abs(a - b))
        out[k] = (diff / np.max(np.abs(a)), diff / max(np.max(np.abs(a - initial[k])), 1e-30))
    return out


def check_parity(learned_opt, theta, num_steps=STEPS, source=None, pass_loss=True, **options):
    params, grads, losses = problem()
    want = run_jax(learned_opt, theta, num_steps, params, grads, losses, pass_loss)
    got = run_torch(source or (learned_opt, theta), num_steps, params, grads, losses, pass_loss, **options)
    errs = errors(want, got, params)
    for k, (rel, travel) in errs.items():
        assert np.max(np.abs(want[k] - params[k])) > 1e-4, f"{k} did not move: the comparison would be empty"
        assert rel <= PARAM_TOL and travel <= TRAVEL_TOL, f"{learned_opt!r}: {k} differs: {errs}"
    return errs


@pytest.mark.parametrize("name", torch_architectures())
def test_every_architecture_matches_its_jax_transform(name):
    learned_opt = lopt.base.architecture(name)()
    theta = perturbed(learned_opt.init(jax.random.key(1)), jax.random.key(2))
    check_parity(learned_opt, theta)


# The fast tier checks the recommended and the cheap-on-CPU names; every other shipped name is the slow tier.
FAST_SHIPPED = (lopt.pretrained.RECOMMENDED, "normmlp_v3")


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n in FAST_SHIPPED else (pytest.mark.slow,))
                                  for n in lopt.pretrained.names()])
def test_every_shipped_optimizer_matches_its_jax_transform(name):
    """lt.optimizer(name) is lopt.pretrained.load(name): the deployed architecture (deploy_options applied)."""
    learned_opt, theta = lopt.pretrained.deployed_learned_optimizer(name)
    check_parity(learned_opt, theta, source=name)


CONFIGS = {
    "normmlp_ortho_normalized_adam_vectors": lopt.NormMLPLOpt(orthogonalize=True, normalize_update=True,
                                                              vector_rule="adam", residual_bound=0.5, hidden_layers=2),
    "normmlp_fan_in_cosine": lopt.NormMLPLOpt(schedule="cosine", relative_step=True, fan_in_ref=64.0,
                                              normalize_update=False),
    "mlp_progress_3_layers": lopt.MLPLOpt(use_num_steps=True, hidden_layers=3, hidden_size=8),
    "adafac_progress": lopt.AdafacMLPLOpt(use_num_steps=True),
    "hyper_2_layers": lopt.HyperLOpt(mlp_layers=2),
    # the learned residual moves the final parameters by ~15-20% of their travel (~2-4% at the default
    # residual_init): far above TRAVEL_TOL, so a wrong residual fails
    "celo2_residual_1_weight_decay_3_layers": lopt.Celo2LOpt(residual_init=1.0, weight_decay=0.1, hidden_layers=3),
    "celo2_cosine": lopt.Celo2LOpt(schedule="cosine"),
    # the horizon factor at STEPS = 100 past a reference of 40: every step ×(0.4)^0.7 ≈ 0.53
    "celo2_cosine_horizon": lopt.Celo2LOpt(schedule="cosine", horizon_reference=40, horizon_power=0.7,
                                           residual_init=1.0, residual_horizon_power=0.5),
    # two orthogonalized tensors (dense_w, conv_w) past a depth reference of 1: matrix steps ×(1/2)^0.8 ≈ 0.57
    "celo2_depth": lopt.Celo2LOpt(depth_reference=1, depth_power=0.8),
    # the weight-decay rule with a learned λ = 0.5·exp(3·tanh(s)), s perturbed, on the two matrices only (the
    # bias is not decayed): the decay moves the matrices by 0.7-1.1 times their travel without it
    "celo2_learned_weight_decay": lopt.Celo2LOpt(wd_rate=0.5, wd_learned=True),
    # the loss-aware factor φ = clip(ℓ_0/(2ℓ̄), 1, 3) on λ = 0.5: the problem's losses fall from ~2 to ~0.3, so φ
    # stays 1 for a while, then rises through (1, 3) to the clip
    "celo2_loss_aware_weight_decay": lopt.Celo2LOpt(wd_rate=0.5, wd_loss_power=1.0, wd_loss_max=3.0,
                                                    wd_loss_free=2.0),
    # with a conv kernels' ratio of 5: the conv kernel's φ = clip(ℓ_0/(5ℓ̄), 1, 3) rises later than the dense one's
    "celo2_loss_aware_weight_decay_conv": lopt.Celo2LOpt(wd_rate=0.5, wd_loss_power=1.0, wd_loss_max=3.0,
                                                         wd_loss_free=2.0, wd_conv_loss_free=5.0),
    # a model with a conv kernel: every step (the decay's included) ×2.5
    "celo2_conv_step_scale": lopt.Celo2LOpt(conv_step_scale=2.5, wd_rate=0.5),
    # the no-growth projection of the learned residual (lopt.rules.radial)
    "celo2_residual_no_growth": lopt.Celo2LOpt(residual_no_growth=True),
}


@pytest.mark.parametrize("free", [0.0, 1.5])
def test_residual_no_growth_matches_where_the_projection_acts(free):
    """A theta whose residual is mostly −p/rms(p) (it grows every matrix), so the projection is taken; with
    g = 1.5 the conv kernel (rms · √fan_in ≈ 2.4) starts past g and the dense one (≈ 1.1) below it."""
    learned_opt = lopt.Celo2LOpt(residual_no_growth=True, residual_growth_free=free)
    theta = perturbed(learned_opt.init(jax.random.key(1)), jax.random.key(2), rel=0.02)
    mlp, h = theta["mlp"], learned_opt.hidden_size
    mlp["input"]["w"] = mlp["input"]["w"].at[1, 0].add(1.0).at[1, 1].add(-1.0)  # feature 1 is p
    mlp["hidden_1"]["w"] = mlp["hidden_1"]["w"] + jnp.eye(h)
    mlp["output"]["w"] = mlp["output"]["w"].at[0, 0].add(-1.0).at[1, 0].add(1.0)
    check_parity(learned_opt, theta)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_other_configs_match(name):
    learned_opt = CONFIGS[name]
    check_parity(learned_opt, perturbed(learned_opt.init(jax.random.key(1)), jax.random.key(2)))


def test_learnable_rule_constants_match():
    """A RuledLOpt (`lopt.rules.with_rules`): celo2_v9's chain around a Celo2LOpt, three constants learnable and
    moved off their initial values; torch runs it with the chain as the architecture's fields."""
    from lopt.rules import learned
    chain = lopt.pretrained.info(lopt.pretrained.RECOMMENDED)["rules"]
    lo = learned.with_rules(lopt.Celo2LOpt(), chain, learnable=("loss_aware_decay.rate", "horizon_scaled.power",
                                                                "depth_scaled.power"))
    theta = perturbed(lo.init(jax.random.key(1)), jax.random.key(2))
    theta["rules"] = {"loss_aware_decay": {"rate": np.float32(0.7)}, "horizon_scaled": {"power": np.float32(-0.4)},
                      "depth_scaled": {"power": np.float32(0.5)}}
    check_parity(lo, theta)


@pytest.mark.parametrize("name", ["MLPLOpt", "AdafacMLPLOpt", "NormMLPLOpt", "Celo2LOpt"])
def test_small_blocks_match(name):
    """chunk_size=8: every tensor is walked in many blocks (a partial last one included)."""
    learned_opt = lopt.base.architecture(name)()
    check_parity(learned_opt, perturbed(learned_opt.init(jax.random.key(1)), jax.random.key(2)), chunk_size=8)


def test_without_loss_and_without_horizon_match():
    """require_loss=False steps without the loss (zero loss features, as tx.update without loss=);
    num_steps=None zeroes the progress features on both sides."""
    rnn = lopt.RNNMLPLOpt()
    check_parity(rnn, perturbed(rnn.init(jax.random.key(1)), jax.random.key(2)), pass_loss=False)
    mlp = lopt.MLPLOpt(use_num_steps=True)
    check_parity(mlp, perturbed(mlp.init(jax.random.key(1)), jax.random.key(2)), num_steps=None)


def test_jax_layout_parameters_match_with_layout_jax():
    """Parameters already in JAX layout ([in, out] kernels) match with layout="jax"."""
    lo = lopt.AdafacMLPLOpt()
    check_parity(lo, perturbed(lo.init(jax.random.key(1)), jax.random.key(2)), layout="jax")


@pytest.mark.parametrize("name", ["AdafacMLPLOpt", "normmlp_v3"])
def test_the_parity_test_sees_the_axes(name):
    """A negative control: torch-layout tensors declared as JAX layout factor the wrong axes
    (AdafacMLPLOpt) or take the wrong fan-in (normmlp_v3), and the comparison catches it."""
    if name in lopt.pretrained.names():
        source, (lo, theta) = name, lopt.pretrained.deployed_learned_optimizer(name)
    else:
        lo = lopt.base.architecture(name)()
        theta = perturbed(lo.init(jax.random.key(1)), jax.random.key(2))
        source = (lo, theta)
    params, grads, losses = problem()
    want = run_jax(lo, theta, STEPS, params, grads, losses)
    tp = {k: torch.nn.Parameter(lt.from_jax(v)) for k, v in params.items()}
    opt = lt.optimizer(source, list(tp.values()), num_steps=STEPS, layout="jax")  # wrong: they are torch layout
    for g, loss in zip(grads, losses):
        for k, p in tp.items():
            p.grad = lt.from_jax(g[k])
        opt.step(loss=float(loss))
    got = {k: lt.to_jax(p.detach()) for k, p in tp.items()}
    errs = errors(want, got, params)
    assert max(errs["dense_w"][1], errs["conv_w"][1]) > 100 * TRAVEL_TOL, errs


def overshooting_problem(seed=0, steps=STEPS, rho=0.8):
    """problem()'s params and losses with gradients that alternate in sign around a fixed direction
    (ρ of it, 1 − ρ fresh noise): each gradient points back along the last step, so the overshoot
    brake engages."""
    params, _, losses = problem(seed, steps)
    rng = np.random.RandomState(seed + 1)
    base = {k: rng.randn(*s).astype(np.float32) for k, s in SHAPES.items()}
    grads = [{k: (0.1 * (-1) ** t * (rho * base[k] + (1 - rho) * rng.randn(*s))).astype(np.float32)
              for k, s in SHAPES.items()} for t in range(steps)]
    return params, grads, losses


BRAKE_CONFIGS = {"normmlp_brake_random_theta": lopt.NormMLPLOpt(overshoot_gain=0.2),
                 "celo2_brake_random_theta": lopt.Celo2LOpt(overshoot_gain=0.2)}


@pytest.mark.parametrize("name", ["normmlp_v3", *BRAKE_CONFIGS])
def test_overshoot_brake_matches(name):
    """The overshoot brake (global over all parameters) as the JAX transform applies it: normmlp_v3
    as shipped (deploy_options: overshoot_gain 0.2; α falls to its floor here), a random-theta
    NormMLPLOpt(overshoot_gain=0.2) (α falls to ~0.09) and a random-theta Celo2LOpt(overshoot_gain=0.2)
    (α falls to its floor): parameters ≤ 1e-5 relative after 100 steps and α_t within 1e-5 at every step."""
    if name in lopt.pretrained.names():
        (lo, theta), source = lopt.pretrained.deployed_learned_optimizer(name), name
    else:
        lo = BRAKE_CONFIGS[name]
        theta = perturbed(lo.init(jax.random.key(1)), jax.random.key(2))
        source = (lo, theta)
    assert lo.overshoot_gain > 0
    params, grads, losses = overshooting_problem()
    tx = lo.opt_fn(theta, num_steps=STEPS)
    update = jax.jit(tx.update)
    p = jax.tree_util.tree_map(jnp.asarray, params)
    state, want_alpha = tx.init(p), []
    for g, loss in zip(grads, losses):
        updates, state = update(g, state, p, loss=loss)
        p = optax.apply_updates(p, updates)
        want_alpha.append(float(jnp.exp(state.log_brake)))
    want = {k: np.asarray(v) for k, v in p.items()}

    tp = {k: torch.nn.Parameter(lt.from_jax(v)) for k, v in params.items()}
    opt = lt.optimizer(source, list(tp.values()), num_steps=STEPS)
    got_alpha = []
    for g, loss in zip(grads, losses):
        for k, q in tp.items():
            q.grad = lt.from_jax(g[k])
        opt.step(loss=float(loss))
        got_alpha.append(float(torch.exp(opt.state["overshoot_brake"]["log_brake"])))
    got = {k: lt.to_jax(q.detach()) for k, q in tp.items()}

    assert min(want_alpha) < 0.5, f"the brake did not engage (min alpha {min(want_alpha)}): the test would be empty"
    assert np.max(np.abs(np.subtract(want_alpha, got_alpha))) <= 1e-5, (want_alpha, got_alpha)
    errs = errors(want, got, params)
    for k, (rel, travel) in errs.items():
        assert np.max(np.abs(want[k] - params[k])) > 1e-4, f"{k} did not move"
        assert rel <= PARAM_TOL and travel <= TRAVEL_TOL, f"{name}: {k} differs: {errs}"


ROLE_CONFIGS = {"NormMLPLOpt": lopt.NormMLPLOpt(relative_step=True, fan_in_ref=64.0), "Celo2LOpt": lopt.Celo2LOpt()}


@pytest.mark.parametrize("name", sorted(ROLE_CONFIGS))
def test_roles_embedding_and_2d_vector_match(name):
    """A parameter group's role: an nn.Embedding-like table with role="embedding" (JAX: a leaf named
    "embedding"), an nn.Linear-like output layer (torch layout) marked role="embedding" (JAX:
    weight_dimension_numbers gives it param_roles.EMBEDDING) and a 2-D bias with role="vector" (JAX:
    a [heads, head_dim] leaf named "bias") match the JAX transform: NormMLPLOpt's fan-in rule (no
    fan-in factor for an embedding, none of a matrix's step for a vector) and Celo2LOpt's routing
    (the three take the NAdamW path, the dense kernel the orthogonalized one). Without the roles
    they do not (a negative control)."""
    lo = ROLE_CONFIGS[name]
    theta = perturbed(lo.init(jax.random.key(1)), jax.random.key(2))
    rng = np.random.RandomState(3)
    shapes = {"dense": (5, 7), "embed": (11, 6), "attn_bias": (2, 3), "head": (7, 4)}
    params = {k: (rng.randn(*s) * 0.5).astype(np.float32) for k, s in shapes.items()}
    grads = [{k: (rng.randn(*s) * 0.1).astype(np.float32) for k, s in shapes.items()} for _ in range(STEPS)]
    losses = (2.0 * np.exp(-np.arange(STEPS) / 50)).astype(np.float32)
    tree = lambda d: {"dense": {"kernel": d["dense"]}, "embed": {"embedding": d["embed"]},
                      "attn": {"bias": d["attn_bias"]}, "head": {"kernel": d["head"]}}
    dims = {"dense": None, "embed": None, "attn": None, "head": lopt.param_roles.EMBEDDING}
    roles = lopt.param_roles.infer(tree(params), dims)
    assert [roles[k][leaf].kind for k, leaf in (("dense", "kernel"), ("embed", "embedding"), ("attn", "bias"),
                                                ("head", "kernel"))] == ["matrix", "embedding", "vector", "embedding"]
    tx = lo.opt_fn(theta, num_steps=STEPS, weight_dimension_numbers=dims)
    update = jax.jit(tx.update)
    p = jax.tree_util.tree_map(jnp.asarray, tree(params))
    state = tx.init(p)
    for g, loss in zip(grads, losses):
        updates, state = update(tree(g), state, p, loss=loss)
        p = optax.apply_updates(p, updates)
    want = {"dense": np.asarray(p["dense"]["kernel"]), "embed": np.asarray(p["embed"]["embedding"]),
            "attn_bias": np.asarray(p["attn"]["bias"]), "head": np.asarray(p["head"]["kernel"])}

    def run(with_roles):
        tp = {"dense": torch.nn.Parameter(lt.from_jax(params["dense"])),
              "embed": torch.nn.Parameter(torch.tensor(params["embed"])),  # nn.Embedding.weight [vocab, dim]
              "attn_bias": torch.nn.Parameter(torch.tensor(params["attn_bias"])),
              "head": torch.nn.Parameter(lt.from_jax(params["head"]))}  # nn.Linear.weight [out, in]
        extra = lambda role: {"role": role} if with_roles else {}
        opt = lt.optimizer((lo, theta), [{"params": [tp["dense"]]},
                                         {"params": [tp["embed"]], "layout": "jax", **extra("embedding")},
                                         {"params": [tp["attn_bias"]], "layout": "jax", **extra("vector")},
                                         {"params": [tp["head"]], **extra("embedding")}],
                           num_steps=STEPS)
        for g, loss in zip(grads, losses):
            tp["dense"].grad, tp["head"].grad = lt.from_jax(g["dense"]), lt.from_jax(g["head"])
            tp["embed"].grad, tp["attn_bias"].grad = torch.tensor(g["embed"]), torch.tensor(g["attn_bias"])
            opt.step(loss=float(loss))
        return {"dense": lt.to_jax(tp["dense"].detach()), "embed": tp["embed"].detach().numpy(),
                "attn_bias": tp["attn_bias"].detach().numpy(), "head": lt.to_jax(tp["head"].detach())}

    errs = errors(want, run(True), params)
    for k, (rel, travel) in errs.items():
        assert np.max(np.abs(want[k] - params[k])) > 1e-4, f"{k} did not move"
        assert rel <= PARAM_TOL and travel <= TRAVEL_TOL, f"{name}: {k} differs: {errs}"
    wrong = errors(want, run(False), params)
    assert min(wrong["embed"][1], wrong["attn_bias"][1], wrong["head"][1]) > 100 * TRAVEL_TOL, wrong

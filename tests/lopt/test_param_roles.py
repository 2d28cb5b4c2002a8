"""lopt.param_roles: each layer kind's role and fan-in, and NormMLPLOpt's μP step per layer kind (numbers)."""
import warnings

import flax.linen as nn
import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import lopt
from lopt import param_roles

D_MODEL, HEADS, HEAD_DIM, VOCAB = 64, 4, 16, 50


class FlaxNet(nn.Module):
    @nn.compact
    def __call__(self, images, ids):
        e = nn.Embed(VOCAB, D_MODEL)(ids)
        a = nn.MultiHeadDotProductAttention(num_heads=HEADS, qkv_features=HEADS * HEAD_DIM)(e)
        c = nn.Conv(8, (3, 3))(images)
        return nn.Dense(10)(a), c


def flax_params():
    return FlaxNet().init(jax.random.key(0), jnp.zeros((1, 6, 6, 3)), jnp.zeros((1, 7), jnp.int32))


def _haiku_net(images, ids):
    e = hk.Embed(VOCAB, D_MODEL)(ids)
    a = hk.MultiHeadAttention(num_heads=HEADS, key_size=HEAD_DIM, model_size=D_MODEL,
                              w_init=hk.initializers.VarianceScaling(1.0))(e, e, e)
    return hk.Linear(10)(a), hk.Conv2D(8, 3)(images), hk.Conv1D(8, 5)(images[:, 0]), hk.Conv2DTranspose(8, 3)(images)


def haiku_params():
    return hk.transform(_haiku_net).init(jax.random.key(0), jnp.zeros((1, 6, 6, 3)), jnp.zeros((1, 7), jnp.int32))


# (path as written by jax.tree_util.keystr, kind, fan_in): every leaf of each model, the numbers by hand
FLAX_ROLES = {
    "['params']['Embed_0']['embedding']": ("embedding", None),                       # [50, 64]
    "['params']['MultiHeadDotProductAttention_0']['query']['kernel']": ("matrix", D_MODEL),  # [64, 4, 16]
    "['params']['MultiHeadDotProductAttention_0']['key']['kernel']": ("matrix", D_MODEL),
    "['params']['MultiHeadDotProductAttention_0']['value']['kernel']": ("matrix", D_MODEL),
    "['params']['MultiHeadDotProductAttention_0']['out']['kernel']": ("matrix", HEADS * HEAD_DIM),  # [4, 16, 64]
    "['params']['MultiHeadDotProductAttention_0']['query']['bias']": ("vector", None),  # [4, 16]
    "['params']['MultiHeadDotProductAttention_0']['key']['bias']": ("vector", None),
    "['params']['MultiHeadDotProductAttention_0']['value']['bias']": ("vector", None),
    "['params']['MultiHeadDotProductAttention_0']['out']['bias']": ("vector", None),
    "['params']['Conv_0']['kernel']": ("matrix", 3 * 3 * 3),                          # [3, 3, 3, 8]
    "['params']['Conv_0']['bias']": ("vector", None),
    "['params']['Dense_0']['kernel']": ("matrix", D_MODEL),                           # [64, 10]
    "['params']['Dense_0']['bias']": ("vector", None),
}
HAIKU_ROLES = {
    "['embed']['embeddings']": ("embedding", None),
    "['multi_head_attention/query']['w']": ("matrix", D_MODEL),   # haiku's attention projections are 2-D
    "['multi_head_attention/key']['w']": ("matrix", D_MODEL),
    "['multi_head_attention/value']['w']": ("matrix", D_MODEL),
    "['multi_head_attention/linear']['w']": ("matrix", HEADS * HEAD_DIM),
    "['linear']['w']": ("matrix", D_MODEL),
    "['conv2_d']['w']": ("matrix", 3 * 3 * 3),                    # [3, 3, in 3, out 8]
    "['conv1_d']['w']": ("matrix", 5 * 3),                        # [5, in 3, out 8]
    "['conv2_d_transpose']['w']": ("matrix", 3 * 3 * 3),          # [3, 3, out 8, in 3]: haiku puts in last
}


def _roles_by_path(params):
    roles = param_roles.infer(params)
    return {jax.tree_util.keystr(path): (role.kind, role.fan_in(leaf.shape))
            for (path, leaf), role in zip(jax.tree_util.tree_flatten_with_path(params)[0], jax.tree_util.tree_leaves(roles))}


def test_roles_and_fan_in_of_flax_haiku_and_nnx_layers():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every common layer is read without a warning
        got_flax, got_haiku = _roles_by_path(flax_params()), _roles_by_path(haiku_params())
    assert got_flax == FLAX_ROLES
    for path, want in HAIKU_ROLES.items():
        assert got_haiku[path] == want, path
    assert {v for k, v in got_haiku.items() if k.endswith("['b']")} == {("vector", None)}
    # conv kernels, and only they, carry spatial axes: all but the last two (haiku's transpose included)
    for params, convs in ((flax_params(), {"['params']['Conv_0']['kernel']": (0, 1)}),
                          (haiku_params(), {"['conv2_d']['w']": (0, 1), "['conv1_d']['w']": (0,),
                                            "['conv2_d_transpose']['w']": (0, 1)})):
        roles = jax.tree_util.tree_leaves(param_roles.infer(params))
        spatial = {jax.tree_util.keystr(path): role.spatial_axes
                   for (path, _), role in zip(jax.tree_util.tree_flatten_with_path(params)[0], roles) if role.is_conv}
        assert spatial == convs

    class NnxNet(nnx.Module):
        def __init__(self, rngs):
            self.emb = nnx.Embed(VOCAB, D_MODEL, rngs=rngs)
            self.attn = nnx.MultiHeadAttention(num_heads=HEADS, in_features=D_MODEL, qkv_features=HEADS * HEAD_DIM,
                                               decode=False, rngs=rngs)
            self.conv = nnx.Conv(3, 8, (3, 3), rngs=rngs)

    state = nnx.state(NnxNet(nnx.Rngs(0)), nnx.Param)
    roles = param_roles.infer(state)
    flat = {param_roles.leaf_names(path): (role.kind, role.fan_in(leaf.shape)) for (path, leaf), role in
            zip(jax.tree_util.tree_flatten_with_path(state)[0], jax.tree_util.tree_leaves(roles))}
    assert flat[("attn", "query", "kernel")] == ("matrix", D_MODEL)
    assert flat[("attn", "out", "kernel")] == ("matrix", HEADS * HEAD_DIM)
    assert flat[("attn", "query", "bias")] == ("vector", None)
    assert flat[("emb", "embedding")] == ("embedding", None)
    assert flat[("conv", "kernel")] == ("matrix", 27)


def _mup_first_step(params, c0=64.0, base_lr=0.01, **opt_kw):
    """|Δp| / base_lr of the first step of a μP NormMLPLOpt whose residual is zero: Adam's first
    direction is sign(g), η = base_lr (fresh step-size head, constant schedule), so |Δp| = base_lr · ρ(p)."""
    lo = lopt.NormMLPLOpt(base_lr=base_lr, normalize_update=False, relative_step=True, relative_floor=1e-6,
                          fan_in_ref=c0, hidden_size=4, lr_hidden_size=4, decays=(0.9,))
    theta = lo.init(jax.random.key(0))
    theta["mlp"]["output"]["w"] = jnp.zeros_like(theta["mlp"]["output"]["w"])
    theta["mlp"]["output"]["b"] = jnp.zeros_like(theta["mlp"]["output"]["b"])
    tx = lo.opt_fn(theta, **opt_kw)
    grads = jax.tree_util.tree_map(lambda p: jnp.full(p.shape, 0.3), params)
    step = tx.update(grads, tx.init(params), params)[0]
    return jax.tree_util.tree_map(lambda u: np.asarray(jnp.abs(u)) / base_lr, step)


def _rms(x):
    return float(np.sqrt(np.mean(np.square(np.asarray(x, np.float64)))))


@pytest.mark.slow  # the fan-in rule itself is fast in test_norm_mlp_lopt (test_fan_in_ref_gives_mup_steps)
@pytest.mark.parametrize("framework", ["flax", "haiku"])
def test_each_layer_kind_takes_the_intended_mup_step(framework):
    """One step of fan_in_ref c₀ = 64: every element of a matrix moves by base_lr · rms(p₀) · √(64/fan_in)
    with fan_in its true one (a flax query kernel [64, 4, 16]: 64, not the 256 of ∏ shape[:-1]; its
    output kernel [4, 16, 64]: 64; a conv [3, 3, 3, 8]: 27), an embedding by base_lr · rms(p₀) (no
    fan-in factor, not the √(64/vocab) of reading the vocabulary as fan-in), a vector by base_lr."""
    params = flax_params() if framework == "flax" else haiku_params()
    want_roles = FLAX_ROLES if framework == "flax" else HAIKU_ROLES
    steps = _mup_first_step(params)
    flat_p = {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_flatten_with_path(params)[0]}
    flat_s = {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_flatten_with_path(steps)[0]}
    checked = set()
    for path, p in flat_p.items():
        kind, fan_in = want_roles.get(path, ("vector", None) if p.ndim < 2 else (None, None))
        if kind is None:
            continue
        want = {"matrix": lambda: _rms(p) * np.sqrt(64.0 / fan_in), "embedding": lambda: _rms(p),
                "vector": lambda: 1.0}[kind]()
        np.testing.assert_allclose(flat_s[path], want, rtol=1e-4, err_msg=path)
        checked.add(kind)
    assert checked == {"matrix", "embedding", "vector"}
    if framework == "flax":  # the old rule's numbers, for the record: the query kernel's step was half
        q = "['params']['MultiHeadDotProductAttention_0']['query']['kernel']"
        old = _rms(flat_p[q]) * np.sqrt(64.0 / (D_MODEL * HEADS))
        np.testing.assert_allclose(flat_s[q] / old, 2.0, rtol=1e-4)


def test_user_dimension_numbers_pytree_prefix_and_callable():
    """A pytree of MuonDimensionNumbers / ParamRole / None (None: infer), a prefix entry for a whole
    subtree, or a callable (path, shape) decide the role; the step follows it (numbers)."""
    p = {"mix": {"kernel": jnp.full((4, 6, 5), 0.5)}, "dense": {"w": jnp.full((16, 3), 0.25), "b": jnp.zeros(3)}}
    dims = {"mix": {"kernel": optax.contrib.MuonDimensionNumbers(reduction_axis=(0, 1), output_axis=2)},
            "dense": None}
    roles = param_roles.infer(p, dims)
    assert roles["mix"]["kernel"] == param_roles.matrix((0, 1)) and roles["dense"]["w"] == param_roles.MATRIX
    assert roles["dense"]["b"] == param_roles.VECTOR
    s = _mup_first_step(p, weight_dimension_numbers=dims)
    np.testing.assert_allclose(s["mix"]["kernel"], 0.5 * np.sqrt(64 / 24), rtol=1e-5)   # fan_in 4·6
    np.testing.assert_allclose(s["dense"]["w"], 0.25 * np.sqrt(64 / 16), rtol=1e-5)
    s = _mup_first_step(p, weight_dimension_numbers=lambda path, shape: param_roles.matrix(0) if path[0] == "mix" else None)
    np.testing.assert_allclose(s["mix"]["kernel"], 0.5 * np.sqrt(64 / 4), rtol=1e-5)    # fan_in 4
    s = _mup_first_step(p, weight_dimension_numbers={"mix": param_roles.EMBEDDING, "dense": None})  # a prefix entry
    np.testing.assert_allclose(s["mix"]["kernel"], 0.5, rtol=1e-5)
    seen = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the callable answers None for "mix", which inference cannot read
        param_roles.infer(p, lambda path, shape: seen.append((path, shape)))
    assert sorted(seen) == [(("dense", "b"), (3,)), (("dense", "w"), (16, 3)), (("mix", "kernel"), (4, 6, 5))]


@pytest.mark.parametrize("dims, match", [
    ({"a": param_roles.matrix(2)}, "do not fit"),
    ({"a": optax.contrib.MuonDimensionNumbers(0, 0)}, "overlap"),
    ({"a": "dense"}, "expected a ParamRole"),
    ({"b": None}, "does not match the params"),
])
def test_bad_dimension_numbers_are_refused(dims, match):
    with pytest.raises((ValueError, TypeError), match=match):
        param_roles.infer({"a": jnp.zeros((3, 4))}, dims)


def test_spatial_axes_must_be_reduction_axes_of_a_matrix():
    with pytest.raises(ValueError, match=r"spatial axes \(1,\) must be reduction axes"):
        param_roles.ParamRole("matrix", (0,), (1,))
    with pytest.raises(ValueError, match="spatial axes"):
        param_roles.ParamRole("vector", (), (0,))
    assert param_roles.matrix((-3, -2), ndim=3, spatial_axes=(-3,)) == param_roles.ParamRole("matrix", (0, 1), (0,))


def test_unreadable_kernel_warns_once_or_raises_when_strict():
    """A rank-3 leaf outside a known layer: read as a conv kernel, with one warning naming its path,
    shape and the assumption; strict_roles=True raises instead."""
    p = {"mystery": {"kernel": jnp.ones((5, 6, 7))}}
    param_roles._WARNED.discard(("['mystery']['kernel']", (5, 6, 7)))
    with pytest.warns(UserWarning, match=r"\['mystery'\]\['kernel'\] \(5, 6, 7\): read as a conv kernel .* = 30"):
        roles = param_roles.infer(p)
    assert roles["mystery"]["kernel"] == param_roles.matrix((0, 1), spatial_axes=(0,))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        param_roles.infer(p)  # once per path and shape
    with pytest.raises(ValueError, match=r"cannot tell the input axes of 1 parameter\(s\): \['mystery'\]\['kernel'\]"):
        _mup_first_step(p, strict_roles=True)


def test_roles_are_static_one_compilation():
    """Roles come from paths and shapes only: new parameter values do not retrace the update."""
    lo = lopt.NormMLPLOpt(relative_step=True, fan_in_ref=64.0, hidden_size=4, lr_hidden_size=4, decays=(0.9,))
    tx = lo.opt_fn(lo.init(jax.random.key(0)))
    traces = []

    @jax.jit
    def step(params, state, grads):
        traces.append(1)
        return tx.update(grads, state, params)

    params = flax_params()
    state = tx.init(params)
    for i in range(3):
        grads = jax.tree_util.tree_map(lambda x: jnp.full(x.shape, 0.1 * (i + 1)), params)
        params2 = jax.tree_util.tree_map(lambda x: x * (1.0 + i), params)
        _, state = step(params2, state, grads)
    assert len(traces) == 1


def test_pretrained_load_takes_dimension_numbers():
    """`lopt.pretrained.load(..., weight_dimension_numbers=..., strict_roles=...)` reaches the fan-in rule."""
    import lopt.pretrained
    p = {"mystery": {"kernel": jnp.ones((5, 6, 7))}}
    with pytest.raises(ValueError, match="cannot tell the input axes"):
        lopt.pretrained.load("normmlp_v3", num_steps=10, strict_roles=True).init(p)
    dims = {"mystery": {"kernel": optax.contrib.MuonDimensionNumbers(reduction_axis=0, output_axis=(1, 2))}}
    state = lopt.pretrained.load("normmlp_v3", num_steps=10, weight_dimension_numbers=dims, strict_roles=True).init(p)
    state = getattr(state, "inner", state)  # normmlp_v3 is deployed with the overshoot brake around its state
    np.testing.assert_allclose(state.scales["mystery"]["kernel"], 1.0 * np.sqrt(64.0 / 5), rtol=1e-6)  # rms 1, fan_in 5

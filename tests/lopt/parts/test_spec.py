"""Each architecture's spec (`lopt.parts.spec`) is what its JAX implementation builds and what lopt.torch reads."""
import dataclasses
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lopt
from lopt.parts import factored, moment_features, newton_schulz
from lopt.parts.spec import PARAM, STEP, TENSOR, ArchSpec, StateField, reorder

# a small tree: a matrix, a vector, a rank-4 kernel and a scalar (JAX layout)
PARAMS = {"w": jnp.ones((5, 3)), "b": jnp.ones((3,)), "conv": jnp.ones((2, 2, 3, 4)), "s": jnp.ones(())}
# variants whose state differs from the default config's
VARIANTS = [lopt.NormMLPLOpt(overshoot_gain=0.5, orthogonalize=True), lopt.Celo2LOpt(overshoot_gain=0.5),
            lopt.Celo2LOpt(wd_rate=0.1, wd_loss_power=1.0)]


def _builtin():
    return [lopt.architecture(n)() for n in lopt.architectures()
            if lopt.architecture(n).__module__.startswith("lopt.archs.") and hasattr(lopt.architecture(n), "spec")]


def _with_torch_rule():
    torch_rule = pytest.importorskip("lopt.torch.rule", reason="PyTorch is not installed")
    import lopt.torch.archs  # noqa: F401  (registers the rules)
    return torch_rule.supported_architectures()


def _named_leaves(state, out=None):
    """{field name: value} of a (nested) NamedTuple or flax dataclass optimizer state, read flat; a field
    holding None (an option that is off, e.g. Celo2LOpt's loss_start) holds no state."""
    out = {} if out is None else out
    names = state._fields if hasattr(state, "_fields") else [f.name for f in dataclasses.fields(state)]
    for name in names:
        value = getattr(state, name)
        if hasattr(value, "_fields") or dataclasses.is_dataclass(value):
            _named_leaves(value, out)
        elif name not in ("inner",) and value is not None:
            out[name] = value
    return out


def _state_of(lo):
    tx = lo.opt_fn(jax.jit(lo.init)(jax.random.key(0)), num_steps=10)
    state = jax.jit(tx.init)(PARAMS)
    parts = state if isinstance(state, tuple) and not hasattr(state, "_fields") else (state,)
    named = {}
    for part in parts:  # optax chains: a tuple of states
        if hasattr(part, "_fields") or dataclasses.is_dataclass(part):
            _named_leaves(part, named)
    return named


def test_every_architecture_with_two_implementations_has_a_spec():
    # RuledLOpt runs in torch as its inner architecture (lopt.torch.rules.learned), whose spec this checks
    names = set(_with_torch_rule()) - {"RuledLOpt"}
    assert {"MLPLOpt", "AdafacMLPLOpt", "RNNMLPLOpt", "NNAdam", "HyperLOpt", "NormMLPLOpt", "Celo2LOpt"} <= names
    for name in names:
        spec = lopt.architecture(name)().spec()
        assert isinstance(spec, ArchSpec) and spec.name == name


@pytest.mark.filterwarnings("ignore:lopt.param_roles")
@pytest.mark.parametrize("lo", _builtin() + VARIANTS, ids=lambda lo: lo.spec().name + str(len(lo.spec().state)))
def test_the_spec_state_layout_is_the_state_init_builds(lo):
    spec, named = lo.spec(), _state_of(lo)
    assert sorted(named) == sorted(f.name for f in spec.state), "the spec names other state fields than init's"
    leaves = jax.tree_util.tree_leaves(PARAMS)
    for field in spec.state:
        value = named[field.name]
        assert str(jnp.result_type(*jax.tree_util.tree_leaves(value))) == field.dtype, field.name
        if field.scope == PARAM:
            got = [np.asarray(x) for x in jax.tree_util.tree_structure(PARAMS).flatten_up_to(value)]
            assert [x.shape for x in got] == [field.shape(p.shape) for p in leaves], field.name
        elif field.scope == TENSOR:
            got = [np.asarray(value)]
            assert got[0].shape == (len(leaves),) + field.shape(), field.name
        else:
            got = [np.asarray(value)]
            assert got[0].shape == field.shape(), field.name
        # ρ(p) is computed at init (fill: its value without relative_step); δ_i follow from the horizon
        if field.name not in ("scales", "decays"):
            assert all(np.all(x == field.fill) for x in got), field.name


def _first_layer_width(lo, theta):
    name = type(lo).__name__
    if name in ("MLPLOpt", "AdafacMLPLOpt", "RNNMLPLOpt"):
        return theta["input"]["w"].shape[0]
    if name in ("NormMLPLOpt", "Celo2LOpt", "Celo"):
        return theta["mlp"]["input"]["w"].shape[0]
    if name == "HyperLOpt":  # the generated MLP's first layer; the LSTM reads one statistic per feature first
        assert theta["lstm"]["wx"].shape[0] == lo.num_features + 1 + len(lo.timescales) + 5
        return lo.layer_shapes()[0][0]
    if name == "NNAdam":  # the LSTM's first rows read the per-tensor statistics
        return theta["lstm"]["wx"].shape[0] - (1 + len(lo.timescales) + 5)
    return 0  # the learnable hyper-parameters have no network


@pytest.mark.parametrize("lo", _builtin() + [lopt.MLPLOpt(decays=(0.5, 0.9)),
                                             lopt.AdafacMLPLOpt(momentum_decays=(0.9,), adafactor_decays=(0.5, 0.99))],
                         ids=lambda lo: lo.spec().name + str(lo.spec().num_features))
def test_the_feature_count_is_the_width_of_the_first_layer_init_builds(lo):
    assert lo.spec().num_features == _first_layer_width(lo, jax.eval_shape(lo.init, jax.random.key(0)))


def test_feature_names():
    assert moment_features.feature_names(2) == ("g", "p", "m_1", "m_2", "sqrt_v", "g_over_sqrt_v", "m_0.9_over_sqrt_v")
    names = factored.feature_names(2, 3)
    assert len(names) == 4 + 2 * 2 + 3 * 3 + 2 * 3 == factored.num_leaf_features(2, 3)
    assert names[:9] == ("g", "p", "m_1", "m_2", "sqrt_v", "m_1_over_sqrt_v", "m_2_over_sqrt_v", "rsqrt_v",
                         "g_over_sqrt_f_1")
    assert names[-3:] == ("m_2_over_sqrt_f_1", "m_2_over_sqrt_f_2", "m_2_over_sqrt_f_3")


def test_newton_schulz_constants_are_optax_muons():
    defaults = inspect.signature(optax.contrib.scale_by_muon).parameters
    assert newton_schulz.NS_COEFFS == defaults["ns_coeffs"].default
    assert newton_schulz.NS_STEPS == defaults["ns_steps"].default and newton_schulz.NS_EPS == defaults["eps"].default


def test_reorder_and_bad_specs():
    assert reorder([1, 2, 3], ("a", "b", "c"), ("c", "a", "b")) == [3, 1, 2]
    np.testing.assert_array_equal(reorder(np.array([1, 2, 3]), ("a", "b", "c"), ("b", "c", "a")), [2, 3, 1])
    with pytest.raises(ValueError, match="not the spec's"):
        reorder([1, 2], ("a", "b"), ("a", "c"))
    with pytest.raises(ValueError, match="twice"):
        ArchSpec("X", ("g", "g"), {}, ())
    with pytest.raises(ValueError, match="scope"):
        StateField("x", "leaf")
    spec = lopt.MLPLOpt().spec()
    with pytest.raises(ValueError, match="no feature 'q'"):
        spec.feature_index("q")
    assert spec.field("momenta").shape((4, 3)) == (6, 4, 3) and spec.field("iteration").scope == STEP


# ---- lopt.torch reads the spec: its features come in the spec's order, by name ----

def _torch_flat(names, g, p, m, v, mom_idx):
    torch = pytest.importorskip("torch")
    from lopt.torch.parts.moment_features import fill_features
    t = lambda x: torch.tensor(np.asarray(x))
    out = torch.empty((len(names), g.shape[0]))
    return fill_features(out, t(g), t(p), t(m), t(v), mom_idx, names, lopt.MLPLOpt().spec().constants["eps"]).numpy()


def test_torch_flat_features_are_the_jax_features_in_the_spec_order():
    rng = np.random.RandomState(0)
    g, p, v = rng.randn(9), rng.randn(9), rng.rand(9)
    m = rng.randn(3, 9)
    g, p, v, m = (x.astype(np.float32) for x in (g, p, v, m))
    lo = lopt.MLPLOpt(decays=(0.5, 0.9, 0.99))
    names = lo.spec().features
    jax_feats = np.asarray(jax.jit(lambda *a: jnp.stack(moment_features.leaf_features(*a, lo.momentum_index)))(g, p, m, v))
    np.testing.assert_allclose(_torch_flat(names, g, p, m, v, lo.momentum_index), jax_feats, rtol=1e-6, atol=1e-7)
    # another order of the same names: torch follows it by name
    shuffled = ("sqrt_v", "p", "m_0.9_over_sqrt_v", "m_1", "m_2", "m_3", "g", "g_over_sqrt_v")
    np.testing.assert_allclose(_torch_flat(shuffled, g, p, m, v, lo.momentum_index),
                               jax_feats[[names.index(n) for n in shuffled]], rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="one block of rows"):
        _torch_flat(("g", "p", "m_1", "sqrt_v", "m_2", "m_3", "g_over_sqrt_v", "m_0.9_over_sqrt_v"), g, p, m, v, 1)


def test_torch_factored_features_are_the_jax_features_in_the_spec_order():
    torch = pytest.importorskip("torch")
    from lopt.torch.parts.factored import FactoredLeaf, decays_of
    from lopt.torch.parts.layout import Workspace
    from lopt.torch.parts.spec import param_state
    from lopt.torch.rule import Item
    lo = lopt.AdafacMLPLOpt(momentum_decays=(0.9, 0.99), adafactor_decays=(0.5, 0.99))
    spec, theta = lo.spec(), lo.init(jax.random.key(0))
    rng = np.random.RandomState(1)
    p, g = rng.randn(6, 4).astype(np.float32), rng.randn(6, 4).astype(np.float32)
    @jax.jit
    def jax_features(g, p):  # one accumulation from zeros, then the features
        dec = jax.tree_util.tree_map(jax.nn.sigmoid, theta["decays"])
        acc = factored.accumulate(g, factored.init_accum(p, 2, 2), dec["momentum"], dec["rms"][0], dec["adafactor"])
        return jnp.stack(jnp.broadcast_arrays(*factored.leaf_features(g, p, acc)))

    want = np.asarray(jax_features(g, p))
    # torch: the same parameter as a torch layout [out, in] weight (axes (1, 0)), its state from the spec
    param = torch.tensor(p.T.copy())
    item = Item(param, torch.tensor(g.T.copy()), param_state(spec, param, (1, 0), torch.float32), (1, 0), None, 1 << 20)
    assert set(item.state) == {"momenta", "rms", "fac_row", "fac_col"}
    assert tuple(item.state["fac_row"].shape) == spec.field("fac_row").shape(p.shape) == (2, 6)
    leaf = FactoredLeaf(item, torch.float32, spec, Workspace())
    leaf.accumulate(decays_of({k: torch.tensor(np.asarray(v)) for k, v in theta["decays"].items()}))
    got = leaf.features(0, 4).numpy().reshape(len(spec.features), 4, 6).transpose(0, 2, 1)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)

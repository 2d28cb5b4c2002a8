"""Contracts of every learned optimizer's update beyond optax's suites (tests/lopt/test_optax_conformance.py):
finite derivatives through `update` and through unrolls, init on abstract params, the leaves it
refuses (complex, integer, float0) and traced horizons; sharded updates under `-m multidevice`."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import lopt
import lopt.pretrained
from lopt.archs.norm_mlp_lopt import NormMLPLOpt
from tests.fixtures import builtin_architectures

K1, K2 = jax.random.split(jax.random.key(0))
PARAMS = {"w": jax.random.normal(K1, (5, 4)) * 0.3, "b": jnp.zeros((4,))}
TARGET = jax.random.normal(K2, (5, 4))


def loss(p):
    return jnp.sum((p["w"] - TARGET) ** 2) + jnp.sum((p["b"] - 1.0) ** 2)


@functools.cache
def optimizer(name: str):
    if name in lopt.pretrained.names():
        return lopt.pretrained.load(name, num_steps=10)
    lo = lopt.architecture(name)()
    return lo.opt_fn(lo.init(jax.random.key(1)), num_steps=10)


# every architecture: NormMLPLOpt and Celo2LOpt as shipped (normmlp_v3 with the overshoot brake, celo2_v5 with
# the horizon and depth rules, which their default configs leave off; one compile each, not two), the others
# at their default config
SHIPPED_FOR = {"NormMLPLOpt": "normmlp_v3", "Celo2LOpt": "celo2_v5"}
DIFFERENTIATED = tuple(SHIPPED_FOR.get(name, name) for name in builtin_architectures())


# Differentiating the largest updates takes minutes on 2 cores: those are the slow tier (the same check's code runs
# fast on the others).
SLOW_TO_DIFFERENTIATE = {"HyperLOpt", "AdafacMLPLOpt", "Celo", "CeloAdam", "celo2_v5", "normmlp_v3", "RNNMLPLOpt"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=(pytest.mark.slow,) if n in SLOW_TO_DIFFERENTIATE else ())
                                  for n in DIFFERENTIATED])
def test_derivatives_through_update_and_unrolls_are_finite(name):
    """d loss(p_1)/d p_0 and d loss(p_5)/d p_0 through the unroll, and d Σ update / d g at step 0
    (where the overshoot brake's cosine has no last step), are finite and not all zero."""
    tx = optimizer(name)

    def unroll(p0):
        def body(carry, _):
            p, s = carry
            value, g = jax.value_and_grad(loss)(p)
            u, s = tx.update(g, s, p, loss=value)
            p = optax.apply_updates(p, u)
            return (p, s), loss(p)
        _, losses = jax.lax.scan(body, (p0, tx.init(p0)), length=5)
        return losses[jnp.asarray([0, 4])]

    def first_update(g):
        return sum(jnp.sum(u) for u in jax.tree.leaves(tx.update(g, tx.init(PARAMS), PARAMS, loss=loss(PARAMS))[0]))

    jac, dg = jax.jit(lambda p, g: (jax.jacrev(unroll)(p), jax.grad(first_update)(g)))(
        PARAMS, jax.tree.map(jnp.ones_like, PARAMS))
    for steps, leaves in ((1, [x[0] for x in jax.tree.leaves(jac)]), (5, [x[1] for x in jax.tree.leaves(jac)]),
                          ("update", jax.tree.leaves(dg))):
        assert all(bool(jnp.all(jnp.isfinite(x))) for x in leaves), (name, steps)
    assert any(float(jnp.max(jnp.abs(x))) > 0 for x in jax.tree.leaves(jac)), name


def test_init_on_abstract_params_reads_no_values():
    """NormMLPLOpt with relative_step reads each matrix's RMS at init: on ShapeDtypeStructs its
    init returns the state's shapes and dtypes, as jax.eval_shape of a concrete init does."""
    lo = NormMLPLOpt(relative_step=True, overshoot_gain=0.2)
    tx = lo.opt_fn(lo.init(jax.random.key(0)))
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), PARAMS)
    got = tx.init(abstract)
    want = jax.eval_shape(tx.init, PARAMS)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    assert [(x.shape, x.dtype) for x in jax.tree.leaves(got)] == [(x.shape, x.dtype) for x in jax.tree.leaves(want)]
    assert float(tx.init(PARAMS)[0].scales["w"]) == pytest.approx(float(jnp.sqrt(jnp.mean(PARAMS["w"] ** 2))))


@pytest.mark.parametrize("leaf,pattern", [
    (jnp.asarray([1 + 1j, 2 - 1j, 0.5j], jnp.complex64), r"\['z'\] has dtype complex64.*split_real_and_imaginary"),
    (jnp.asarray([1, 2, 3], jnp.int32), r"\['z'\] has dtype int32.*optax.partition"),
])
def test_complex_and_integer_leaves_are_refused_naming_the_leaf(leaf, pattern):
    tx = optimizer("celo2_v5")
    params = {"a": jnp.ones((3,)), "z": leaf}
    with pytest.raises(TypeError, match=pattern):
        tx.update(params, tx.init(params), params)


def test_float0_gradients_are_refused_naming_the_leaf():
    tx = optimizer("normmlp_v3")
    params = {"a": jnp.ones((3,)), "n": jnp.ones((2,))}
    grads = {"a": jnp.ones((3,)), "n": np.zeros((2,), jax.dtypes.float0)}
    with pytest.raises(TypeError, match=r"gradient of leaf \['n'\] has dtype float0"):
        tx.update(grads, tx.init(params), params)


def test_complex_params_split_into_real_and_imaginary_parts():
    """The documented way for complex parameters: optax.contrib.split_real_and_imaginary(tx)
    optimises the real and imaginary parts as two real parameters (what optax's complex support does)."""
    tx = optax.contrib.split_real_and_imaginary(optimizer("celo2_v5"))
    p = jnp.asarray([1 + 1j, 2 - 1j, 0.5j], jnp.complex64)
    g = jnp.asarray([1j, -1j, 1j], jnp.complex64)
    u, _ = tx.update(g, tx.init(p), p)
    plain = optimizer("celo2_v5")
    want = plain.update(jnp.imag(g), plain.init(jnp.imag(p)), jnp.imag(p))[0]
    assert u.dtype == jnp.complex64
    np.testing.assert_allclose(np.imag(u), want, rtol=1e-6)
    assert float(jnp.max(jnp.abs(jnp.imag(u)))) > 0


def test_load_takes_a_traced_horizon():
    """`opt_fn` documents num_steps as possibly traced; `lopt.pretrained.load` agrees: a traced
    horizon gives the update of the same horizon given as an int."""
    grads = jax.tree.map(lambda p: jnp.sin(p + 0.3), PARAMS)

    def step(n):
        tx = lopt.pretrained.load("celo2_v5", num_steps=n)
        return tx.update(grads, tx.init(PARAMS), PARAMS)[0]

    got = jax.jit(step)(jnp.asarray(7))
    want = step(7)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7), got, want)  # jit vs eager rounding
    with pytest.raises(ValueError, match="scalar array"):
        lopt.pretrained.load("celo2_v5", num_steps=jnp.ones((2,)))


# ----- sharded updates: XLA_FLAGS=--xla_force_host_platform_device_count=4 python -m pytest -m multidevice

def _three_updates(tx, params, shardings=None):
    put = (lambda t: t) if shardings is None else (lambda t: jax.device_put(t, shardings))
    params = put(params)
    state = jax.jit(tx.init)(params)
    for i in range(3):
        grads = put(jax.tree.map(lambda p: jnp.sin(p * (i + 1.3)) + 0.1 * p, params))
        u, state = jax.jit(tx.update)(grads, state, params)
    return u, state


SHARDED_PARAMS = {"w": jax.random.normal(K1, (12, 8)) * 0.2, "b": jax.random.normal(K2, (8,)) * 0.1}
SPECS = {"w": P(None, "x"), "b": P("x")}


@pytest.mark.multidevice
@pytest.mark.parametrize("name", ["celo2_v5", "normmlp_v3"])
@pytest.mark.parametrize("axis_type", ["explicit", "auto"])
def test_sharded_updates_keep_sharding_and_equal_one_device(name, axis_type):
    """Under an explicit mesh (any layout) and under automatic sharding (layout="sharded"), the
    updates and every per-parameter state leaf are sharded as their parameter (momenta: P(None, *spec)),
    and equal the one-device updates to float32 rounding (rtol 1e-4: shard sums add in another order)."""
    if jax.device_count() < 4:
        pytest.skip("needs 4 devices")
    want, _ = _three_updates(lopt.pretrained.load(name, num_steps=10, layout="cpu"), SHARDED_PARAMS)
    mesh = jax.make_mesh((4,), ("x",), axis_types=((AxisType.Explicit if axis_type == "explicit" else AxisType.Auto),))
    shardings = {k: NamedSharding(mesh, s) for k, s in SPECS.items()}
    tx = lopt.pretrained.load(name, num_steps=10, layout="cpu" if axis_type == "explicit" else "sharded")
    if axis_type == "explicit":
        with jax.set_mesh(mesh):
            got, state = _three_updates(tx, SHARDED_PARAMS, shardings)
            abstract = jax.eval_shape(tx.init, jax.device_put(SHARDED_PARAMS, shardings))
    else:
        got, state = _three_updates(tx, SHARDED_PARAMS, shardings)
        abstract = None
    # the architecture's state, inside its deploy rules' states
    momenta, second = optax.tree_utils.tree_get(state, "momenta"), optax.tree_utils.tree_get(state, "second_moment")
    for k, spec in SPECS.items():
        assert got[k].sharding.spec == spec, (k, got[k].sharding)
        assert second[k].sharding.spec == spec
        assert momenta[k].sharding.spec == P(None, *spec)
        # sums over shards add in another order; Celo2's 5 Newton-Schulz steps carry that rounding (3e-5 seen)
        np.testing.assert_allclose(np.asarray(got[k]), np.asarray(want[k]), rtol=1e-4, atol=1e-8)
        if abstract is not None:  # the state's shardings, for planning, from jax.eval_shape of init
            assert optax.tree_utils.tree_get(abstract, "momenta")[k].sharding.spec == P(None, *spec)

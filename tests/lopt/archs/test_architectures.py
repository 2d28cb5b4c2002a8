"""Contract tests shared by every learned-optimizer architecture in lopt (and the Learnable*
hand-designed optimizers, which make the same promises: float32 state, updates in each
parameter's dtype, checked inputs).

Tiny params trees (a matrix, a bf16-able vector, a scalar, a 0-size leaf) keep compiles short.
"""
import dataclasses
import functools
import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax.core import FrozenDict

import lopt
from lopt.parts.layout import UpdateLayout

ARCHS = {
    "MLPLOpt": lambda: lopt.MLPLOpt(hidden_size=8, use_num_steps=True),
    # one decay per accumulator kind: the same code paths with 10 features instead of 28 (compile time)
    "AdafacMLPLOpt": lambda: lopt.AdafacMLPLOpt(momentum_decays=(0.9,), adafactor_decays=(0.99,), use_num_steps=True),
    "RNNMLPLOpt": lambda: lopt.RNNMLPLOpt(lstm_hidden=4, mlp_hidden=4),
    "NNAdam": lambda: lopt.NNAdam(lstm_hidden=4),
    "NormMLPLOpt": lambda: lopt.NormMLPLOpt(hidden_size=4, lr_hidden_size=4, decays=(0.9,), orthogonalize=True),
    "Celo2LOpt": lambda: lopt.Celo2LOpt(hidden_size=4, hidden_layers=1, lr_hidden_size=4, decays=(0.9,)),
    "HyperLOpt": lambda: lopt.HyperLOpt(lstm_hidden=4, momentum_decays=(0.9,), adafactor_decays=(0.99,)),
    "LearnableAdam": lambda: lopt.LearnableAdam(1e-2),
    "LearnableAdamW": lambda: lopt.LearnableAdamW(1e-2, 0.1),
    "LearnableSGDM": lambda: lopt.LearnableSGDM(1e-2),
    "LearnableSGD": lambda: lopt.LearnableSGD(1e-2),
}


def make_params(dtype=jnp.float32):
    k1, k2 = jax.random.split(jax.random.key(0))
    return {"layer": {"w": jax.random.normal(k1, (3, 5), dtype), "b": jax.random.normal(k2, (5,), dtype)},
            "scale": jnp.asarray(0.5, dtype), "empty": jnp.zeros((0, 2), dtype)}


def grads_for(params, i):
    return jax.tree_util.tree_map(lambda p: (jnp.sin(p.astype(jnp.float32) * (i + 1)) + 0.1).astype(p.dtype), params)


@functools.partial(jax.jit, static_argnames=("lo",))
def update(lo, theta, grads, state, params, loss):
    """One update; compiled once per (architecture config, tree, dtypes, loss given or not).
    Learned optimizers hash by value, so tests share these compilations."""
    return lo.opt_fn(theta).update(grads, state, params, **({} if loss is None else {"loss": loss}))


def run_steps(lo, theta, params, n=3, with_loss=True):
    state, outs = lo.opt_fn(theta).init(params), []
    for i in range(n):
        u, state = update(lo, theta, grads_for(params, i), state, params, 1.0 / (i + 1) if with_loss else None)
        params = optax.apply_updates(params, u)
        outs.append(u)
    return outs, params


@pytest.fixture(scope="module", params=sorted(ARCHS))
def arch(request):
    lo = ARCHS[request.param]()
    return lo, lo.init(jax.random.key(1))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_tree_shape_dtype_finite_deterministic(arch, dtype):
    """f32 with a loss, bf16 without one (`loss=` is optional)."""
    lo, theta = arch
    params = make_params(dtype)
    with_loss = dtype == jnp.float32
    (ups, new_params), (ups2, _) = (run_steps(lo, theta, params, with_loss=with_loss) for _ in range(2))
    for u in ups:
        chex.assert_trees_all_equal_shapes_and_dtypes(u, params)
        chex.assert_tree_all_finite(u)
    chex.assert_trees_all_equal(ups, ups2)  # deterministic
    chex.assert_trees_all_equal_shapes_and_dtypes(new_params, params)
    assert float(jnp.abs(ups[-1]["layer"]["w"].astype(jnp.float32)).max()) > 0
    for leaf in jax.tree_util.tree_leaves(lo.opt_fn(theta).init(params)):  # state: float32 / int counters
        assert leaf.dtype in (jnp.float32, jnp.int32), leaf.dtype


def test_grad_through_10_step_unroll_with_traced_num_steps(arch):
    lo, theta = arch
    params0 = make_params()

    def meta_loss(theta, num_steps):
        tx = lo.opt_fn(theta, num_steps=num_steps, is_training=True)
        inner = lambda p: sum(jnp.sum(jnp.square(x - 1.0)) for x in jax.tree_util.tree_leaves(p))

        def step(carry, _):
            params, state = carry
            loss, g = jax.value_and_grad(inner)(params)
            u, state = tx.update(g, state, params, loss=loss)
            return (optax.apply_updates(params, u), state), loss
        _, losses = jax.lax.scan(step, (params0, tx.init(params0)), None, length=10)
        return jnp.mean(losses)

    grads = jax.jit(jax.grad(meta_loss))(theta, jnp.asarray(10))
    chex.assert_tree_all_finite(grads)
    total = sum(float(jnp.sum(jnp.abs(g))) for g in jax.tree_util.tree_leaves(grads))
    assert total > 0


def test_vmap_over_theta(arch):
    lo, theta = arch
    params = make_params()
    noise = jax.tree_util.tree_map(lambda t: 0.01 * jnp.ones_like(t), theta)
    stacked = jax.tree_util.tree_map(lambda t, n: jnp.stack([t, t + n, t - n]), theta, noise)
    state = lo.opt_fn(theta).init(params)
    g = grads_for(params, 0)
    ups, states = jax.jit(jax.vmap(lambda th: lo.opt_fn(th).update(g, state, params, loss=1.0)))(stacked)
    chex.assert_tree_all_finite(ups)
    assert ups["layer"]["w"].shape == (3, 3, 5)
    single, _ = update(lo, theta, g, state, params, 1.0)
    np.testing.assert_allclose(ups["layer"]["w"][0], single["layer"]["w"], rtol=1e-5, atol=1e-9)


def test_save_load_same_updates(arch, tmp_path):
    lo, theta = arch
    theta = jax.tree_util.tree_map(lambda t: t + 0.01, theta)  # not the init value
    path = str(tmp_path / "theta.msgpack")
    lopt.save_theta(path, lo, theta)
    loaded = lopt.load_theta(path, lo)
    chex.assert_trees_all_close(loaded, theta)
    lo2, theta2 = lopt.load_learned_optimizer(path)
    assert lo2 == lo and hash(lo2) == hash(lo)
    params = make_params()
    a, _ = run_steps(lo, theta, params, n=2)
    b, _ = run_steps(lo2, theta2, params, n=2)
    chex.assert_trees_all_close(a, b, rtol=1e-6, atol=0)


def test_wrong_architecture_load_names_both(arch, tmp_path):
    lo, theta = arch
    path = str(tmp_path / "theta.msgpack")
    lopt.save_theta(path, lo, theta)
    other = lopt.LearnableAdam() if not isinstance(lo, lopt.LearnableAdam) else lopt.LearnableSGD()
    with pytest.raises(ValueError) as e:
        lopt.load_theta(path, other)
    msg = str(e.value)
    assert lo.name in msg and other.name in msg and "architecture" in msg


@functools.partial(jax.jit, static_argnames=("lo",))
def _combined_update(lo, theta, grads, state, params):
    tx = optax.MultiSteps(optax.chain(optax.clip_by_global_norm(0.1), lo.opt_fn(theta)), every_k_schedule=2)
    return tx.update(grads, state, params, loss=1.0)


def test_inside_optax_chain_with_clipping_and_multisteps(arch):
    """MultiSteps(chain(clip_by_global_norm, tx)) on a FrozenDict params tree."""
    lo, theta = arch
    params = FrozenDict(make_params())
    tx = optax.MultiSteps(optax.chain(optax.clip_by_global_norm(0.1), lo.opt_fn(theta)), every_k_schedule=2)
    state, ups = tx.init(params), []
    for i in range(4):
        u, state = _combined_update(lo, theta, grads_for(params, i), state, params)
        params = optax.apply_updates(params, u)
        ups.append(u)
    chex.assert_tree_all_finite(ups)
    assert isinstance(params, FrozenDict)
    assert float(jnp.abs(ups[0]["layer"]["w"]).max()) == 0.0  # odd steps only accumulate
    assert float(jnp.abs(ups[1]["layer"]["w"]).max()) > 0.0


def test_empty_params_tree(arch):
    lo, theta = arch
    tx = lo.opt_fn(theta)
    state = tx.init({})
    u, _ = tx.update({}, state, {})
    assert u == {}


def test_mlp_lopt_chunk_size_does_not_change_updates():
    """chunk_size changes speed only: the blockwise column-major path (tensors of at least
    column_min_size parameters) gives the same updates with blocks of 100 parameters (11 blocks,
    the last overlapping its predecessor) as with a single block.

    chunk_size is not in config(), so the two optimizers are equal as static jit arguments and
    would share one compilation of `update`: each is jitted on its own here."""
    params = {"w": jax.random.normal(jax.random.key(3), (37, 29))}  # 1073 parameters >= column_min_size (256)
    chunked, whole = lopt.MLPLOpt(hidden_size=8, chunk_size=100), lopt.MLPLOpt(hidden_size=8)
    assert chunked == whole and jnp.size(params["w"]) >= whole.column_min_size
    theta = jax.tree_util.tree_map(lambda x: 3.0 * x, chunked.init(jax.random.key(0)))  # larger updates
    ups = []
    for lo in (chunked, whole):
        tx = lo.opt_fn(theta)
        step = jax.jit(tx.update)  # a new jitted function per optimizer: no shared cache entry
        state, out = tx.init(params), []
        for i in range(2):
            u, state = step(grads_for(params, i), state, params)
            out.append(u)
        ups.append(out)
    assert float(jnp.abs(ups[0][-1]["w"]).max()) > 1e-4  # not a trivially tiny update
    chex.assert_trees_all_close(ups[0], ups[1], rtol=1e-5, atol=1e-9)


def with_layout(lo, layout):
    """`lo` with its `layout` option set (architectures without one are returned as they are)."""
    return dataclasses.replace(lo, layout=layout) if hasattr(lo, "layout") else lo


# the architectures whose per-tensor statistics are sums over each tensor (`UpdateLayout.blockwise_sum`)
SUMS_IN_BLOCKS = {"MLPLOpt", "AdafacMLPLOpt", "RNNMLPLOpt", "NormMLPLOpt", "Celo2LOpt", "HyperLOpt"}


def test_blockwise_sums_do_not_change_updates(arch):
    """The per-tensor sums taken in blocks of 2 parameters (of 2 rows for AdafacMLPLOpt's matrix)
    give the same updates, over three steps, as whole-tensor sums, and add a loop (a `lax.map`) to
    the update of the architectures that take them; the same under vmap over two models."""
    lo, theta = arch
    params = make_params()

    def steps(lo, vmapped=False):
        tx = lo.opt_fn(theta)
        step = lambda g, s, p: tx.update(g, s, p, loss=jnp.asarray(0.5))
        if vmapped:  # two copies of the model, as meta-training's particles run the update
            two = lambda t: jax.tree_util.tree_map(lambda x: jnp.stack([x, x]), t)
            step = jax.vmap(step)
        else:
            two = lambda t: t
        step = jax.jit(step)  # a fresh jit: no shared cache
        state, out = two(tx.init(params)), []
        for i in range(3):
            u, state = step(two(grads_for(params, i)), state, two(params))
            out.append(jax.tree_util.tree_map(lambda x: x[1], u) if vmapped else u)
        loops = str(jax.make_jaxpr(step)(two(grads_for(params, 0)), two(tx.init(params)), two(params))).count("scan[")
        return out, loops

    whole, whole_loops = steps(lo)
    tiny_sums = with_layout(lo, UpdateLayout("tiny sums", sum_block=2, sum_min_blocks=2))
    in_blocks = type(lo).__name__ in SUMS_IN_BLOCKS
    for vmapped in (False, True):
        blocked, blocked_loops = steps(tiny_sums, vmapped)
        chex.assert_trees_all_close(blocked, whole, rtol=2e-5, atol=1e-7)
        assert (blocked_loops > whole_loops) == in_blocks, (vmapped, blocked_loops, whole_loops)


def test_bf16_params_inside_lax_scan(arch):
    """As PES and train_model run them: a scan carry of bf16 params and the optimizer state keeps
    its types (a float32 β must not promote a bf16 state), the state is float32 and the updates bf16."""
    lo, theta = arch
    params = make_params(jnp.bfloat16)
    tx = lo.opt_fn(theta, num_steps=10)

    def step(carry, i):
        params, state = carry
        grads = jax.tree_util.tree_map(lambda p: (jnp.sin(p.astype(jnp.float32) * i) + 0.1).astype(p.dtype), params)
        u, state = tx.update(grads, state, params, loss=jnp.asarray(1.0) / i)
        return (optax.apply_updates(params, u), state), u

    (new_params, state), ups = jax.jit(lambda c: jax.lax.scan(step, c, jnp.arange(1.0, 4.0)))((params, tx.init(params)))
    chex.assert_trees_all_equal_shapes_and_dtypes(new_params, params)
    assert jax.tree_util.tree_map(lambda u: u.dtype, ups) == jax.tree_util.tree_map(lambda p: p.dtype, params)
    chex.assert_tree_all_finite(ups)
    assert all(leaf.dtype in (jnp.float32, jnp.int32) for leaf in jax.tree_util.tree_leaves(state))


@pytest.mark.parametrize("bad, path", [
    (lambda g: {**g, "layer": {**g["layer"], "w": g["layer"]["w"].reshape(-1)}}, "['layer']['w']"),  # [15] for [3, 5]
    (lambda g: {**g, "layer": {**g["layer"], "b": g["layer"]["b"][:3]}}, "['layer']['b']"),         # [3] for [5]
    (lambda g: {k: v for k, v in g.items() if k != "scale"}, "missing leaf ['scale']"),
])
def test_grads_not_matching_params_are_refused_naming_the_leaf(arch, bad, path):
    """At trace time (under jit), before any arithmetic: MLPLOpt used to flatten a [15] gradient
    into a [3, 5] update, the others failed with a bare broadcasting error."""
    lo, theta = arch
    params = make_params()
    tx = lo.opt_fn(theta)
    with pytest.raises(ValueError, match=r"the gradients given to tx.update do not match the params") as e:
        jax.jit(tx.update)(bad(grads_for(params, 0)), tx.init(params), params)
    assert path in str(e.value) and lo.name in str(e.value)


def test_theta_of_another_shape_is_refused_by_opt_fn_naming_the_leaf(arch):
    """Inside jit and vmap too (theta traced): the check compares static shapes."""
    lo, theta = arch
    leaves, treedef = jax.tree_util.tree_flatten_with_path(theta)
    path = jax.tree_util.keystr(leaves[0][0])
    wrong = treedef.unflatten([jnp.zeros(jnp.shape(x) + (2,)) if i == 0 else x for i, (_, x) in enumerate(leaves)])
    params = make_params()
    state, g = lo.opt_fn(theta).init(params), grads_for(params, 0)
    run = lambda th: lo.opt_fn(th).update(g, state, params)[0]
    for call in (lambda: lo.opt_fn(wrong), lambda: jax.jit(run)(wrong),
                 lambda: jax.vmap(run)(jax.tree_util.tree_map(lambda x: jnp.stack([x, x]), wrong))):
        with pytest.raises(ValueError, match="load_learned_optimizer") as e:
            call()
        assert f"leaf {path} has shape" in str(e.value) and f"{lo.name}.opt_fn" in str(e.value)
    missing = dict(theta)
    key = sorted(missing)[0]
    del missing[key]
    with pytest.raises(ValueError, match=rf"missing leaf \['{key}'\]"):
        lo.opt_fn(missing)


def test_python_float_leaf_is_a_float32_scalar(arch):
    """A plain Python float parameter is read as a float32 0-d array, as optax.apply_updates does:
    the same updates as with jnp.float32(0.5), and a float32 [] update for it."""
    lo, theta = arch
    as_array = make_params()
    as_float = {**as_array, "scale": 0.5}
    tx = lo.opt_fn(theta)
    grads = grads_for(as_array, 0)
    as_float_grads = {**grads, "scale": float(grads["scale"])}
    # closed over, so the optimizer sees the Python floats themselves (jit arguments would become arrays)
    want, _ = jax.jit(lambda: tx.update(grads, tx.init(as_array), as_array))()
    got, _ = jax.jit(lambda: tx.update(as_float_grads, tx.init(as_float), as_float))()
    chex.assert_trees_all_equal(got, want)
    assert got["scale"].dtype == jnp.float32 and got["scale"].shape == ()


def _copies_shaped_like(hlo_text: str, shape: tuple) -> list:
    """The `copy` instructions of a compiled HLO module that write float32 arrays shaped like
    `shape` or like a stack of such arrays ([k, *shape], the momenta)."""
    out = []
    for line in hlo_text.splitlines():
        m = re.search(r"= f32\[([0-9,]*)\]\S* copy\(", line)
        if m and tuple(int(d) for d in m.group(1).split(",") if d)[-len(shape):] == tuple(shape):
            out.append(line.strip())
    return out


def test_donated_train_step_updates_the_state_in_place(arch):
    """A training loop that donates its parameters and optimizer state gets them updated in place:
    the compiled step copies no array shaped like the parameter or its accumulators (such copies
    used to cost MLPLOpt and NormMLPLOpt 10-30% of their step, when the momenta were reshaped
    before being updated). The matrix is not square, so the transposes of NormMLPLOpt's
    orthogonalization do not count."""
    lo, theta = arch
    params = {"w": jax.random.normal(jax.random.key(0), (40, 50)), "b": jnp.zeros((50,))}
    tx = lo.opt_fn(theta)

    def train_step(p, s, g):
        u, s = tx.update(g, s, p, loss=jnp.asarray(1.0))
        return optax.apply_updates(p, u), s

    hlo = jax.jit(train_step, donate_argnums=(0, 1)).lower(params, tx.init(params), grads_for(params, 0)).compile()
    assert _copies_shaped_like(hlo.as_text(), params["w"].shape) == []


def test_accelerator_blocks_do_not_change_updates(arch):
    """With the accelerator layout (`layout="accelerator"`), the per-parameter MLPs run on blocks of
    up to 2^22 parameters and the sums over whole tensors: on a 128 x 160 matrix (the CPU layout's
    blocks: 20 of 1024 for `UpdateLayout.block_size`, 2 of 16384 for Celo2LOpt and NormMLPLOpt)
    the updates over two steps are the CPU-blocked ones up to float32 rounding, and the
    architectures that loop over blocks on the CPU trace no loop there."""
    lo, theta = arch
    k1, k2 = jax.random.split(jax.random.key(3))
    params = {"w": jax.random.normal(k1, (128, 160)) / 12.0, "b": jax.random.normal(k2, (160,))}

    def steps(lo):
        tx = lo.opt_fn(theta)
        step = jax.jit(lambda g, s, p: tx.update(g, s, p, loss=jnp.asarray(0.5)))  # a fresh jit: no shared cache
        state, out = tx.init(params), []
        for i in range(2):
            u, state = step(grads_for(params, i), state, params)
            out.append(u)
        jaxpr = str(jax.make_jaxpr(step)(grads_for(params, 0), tx.init(params), params))
        return out, jaxpr.count("while[") + jaxpr.count("scan[")

    cpu, cpu_loops = steps(with_layout(lo, "cpu"))
    accelerator, accelerator_loops = steps(with_layout(lo, "accelerator"))
    assert float(jnp.abs(cpu[-1]["w"]).max()) > 1e-5  # not a trivially tiny update
    chex.assert_trees_all_close(accelerator, cpu, rtol=2e-5, atol=1e-7)
    assert accelerator_loops <= cpu_loops
    if type(lo).__name__ in {"MLPLOpt", "NormMLPLOpt", "Celo2LOpt"}:  # the per-parameter MLPs in blocks
        assert accelerator_loops < cpu_loops, (cpu_loops, accelerator_loops)

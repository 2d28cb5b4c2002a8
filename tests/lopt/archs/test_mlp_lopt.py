"""MLPLOpt against a direct transcription of its documented math (no folding, no blocking)."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lopt
from lopt.parts.features import step_embedding
from lopt.parts.layout import CPU


def reference_updates(lo, theta, grads_seq, params):
    """Naive MLPLOpt: features [*, F] -> RMS-normalise per tensor -> concat step embedding -> MLP."""
    decays = np.asarray(lo.decays, np.float32)
    mom = {k: np.zeros(v.shape + (len(decays),), np.float32) for k, v in params.items()}
    sec = {k: np.zeros(v.shape, np.float32) for k, v in params.items()}
    w_in = np.concatenate([theta["input"]["w"], theta["input"]["w_time"]], axis=0)
    outs = []
    for t, grads in enumerate(grads_seq):
        emb = np.asarray(step_embedding(t, lo.timescales))
        upd = {}
        for k, p in params.items():
            g = np.asarray(grads[k], np.float32)
            mom[k] = decays * mom[k] + (1 - decays) * g[..., None]
            sec[k] = lo.rms_decay * sec[k] + (1 - lo.rms_decay) * g**2
            r = 1 / np.sqrt(sec[k] + 1e-8)
            i9 = int(np.argmin(np.abs(decays - 0.9)))
            f = np.concatenate([g[..., None], np.asarray(p)[..., None], mom[k],
                                np.stack([np.sqrt(sec[k]), g * r, mom[k][..., i9] * r], -1)], -1)
            f = f / np.sqrt(np.mean(f**2, axis=tuple(range(f.ndim - 1)), keepdims=True) + 1e-8)
            x = np.concatenate([f, np.broadcast_to(emb, f.shape[:-1] + emb.shape)], -1)
            h = np.maximum(x @ w_in + theta["input"]["b"], 0)
            for i in range(1, lo.hidden_layers):
                h = np.maximum(h @ theta[f"hidden_{i}"]["w"] + theta[f"hidden_{i}"]["b"], 0)
            o = h @ theta["output"]["w"] + theta["output"]["b"]
            upd[k] = -o[..., 0] * np.exp(o[..., 1] * lo.exp_mult) * lo.step_mult
        outs.append(upd)
    return outs


@pytest.mark.parametrize("chunk_size,column_min_size", [(5, 0), (16384, 0), (16384, 256)])
def test_matches_reference_over_steps(chunk_size, column_min_size):
    """Both MLP layouts (blocked column-major, and row-major for small tensors) give the math."""
    lo = lopt.MLPLOpt(hidden_size=8, chunk_size=chunk_size, column_min_size=column_min_size)
    theta = jax.tree_util.tree_map(lambda x: x * 3.0, lo.init(jax.random.key(0)))  # larger outputs
    keys = jax.random.split(jax.random.key(1), 8)
    params = {"w": jax.random.normal(keys[0], (3, 4)), "b": jax.random.normal(keys[1], (7,)),
              "s": jnp.asarray(0.5)}
    grads_seq = [jax.tree_util.tree_map(lambda p, i=i: jax.random.normal(keys[2 + i], jnp.shape(p)), params)
                 for i in range(3)]
    expected = reference_updates(lo, jax.tree_util.tree_map(np.asarray, theta), grads_seq, params)
    tx = lo.opt_fn(theta)
    state = tx.init(params)
    update = jax.jit(tx.update)
    for grads, want in zip(grads_seq, expected):
        got, state = update(grads, state, params)
        chex.assert_trees_all_close(got, want, rtol=2e-4, atol=1e-9)
        assert float(jnp.abs(got["w"]).max()) > 1e-4  # not a trivially tiny update


def test_block_size_follows_the_tensor_unless_given():
    """A tensor of n parameters runs in blocks of the layout's `block_size(n)`, a function of n alone
    (1024 for the small tensors of meta-training's tasks, 32768 for a big model's matrices); an
    explicit chunk_size wins (capped at n); 0 is refused; neither is part of config()."""
    from lopt.parts import features as ft
    lo = lopt.MLPLOpt()
    assert [lo.block_size(n) for n in (1000, 2048, 8192, 16384, 802816, 6291456)] == [
        1000, 1024, 1024, 1024, 32768, 32768]
    assert all(lo.block_size(n) == CPU.block_size(n) for n in (256, 2047, 5000, 100_000))
    assert lopt.MLPLOpt(chunk_size=300).block_size(10_000) == 300
    assert lopt.MLPLOpt(chunk_size=300).block_size(256) == 256
    assert "chunk_size" not in lo.config()
    with pytest.raises(ValueError, match="chunk_size >= 1"):
        lopt.MLPLOpt(chunk_size=0)


def test_block_size_changes_speed_not_the_update():
    """A 10,000-parameter tensor in its default blocks (`UpdateLayout.block_size`: 1024, a loop of
    overlapping blocks), in blocks of 300 and in one block of 32768 (no loop): the same updates
    over three steps, up to float32 rounding (XLA's GEMMs of other widths may round differently)."""
    lo = lopt.MLPLOpt(hidden_size=8)
    theta = lo.init(jax.random.key(0))
    params = {"w": jax.random.normal(jax.random.key(1), (100, 100))}
    outs, loops = [], []
    for chunk_size in (None, 300, 32768):
        tx = lopt.MLPLOpt(hidden_size=8, chunk_size=chunk_size).opt_fn(theta)
        fn = jax.jit(tx.update)
        state = tx.init(params)
        loops.append(" while(" in fn.lower(params, state, params).compile().as_text())
        ups = []
        for i in range(3):
            u, state = fn(jax.tree_util.tree_map(lambda p: 0.1 * jnp.sin(p * (i + 1)), params), state, params)
            ups.append(u)
        outs.append(ups)
    assert loops == [True, True, False]
    assert float(jnp.abs(outs[0][-1]["w"]).max()) > 1e-4
    chex.assert_trees_all_close(outs[0], outs[1], rtol=1e-5, atol=1e-9)
    chex.assert_trees_all_close(outs[0], outs[2], rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("theta_per_model", [pytest.param("own", marks=pytest.mark.slow), "broadcast"])  # own: slow tier
def test_vmapped_update_multiplies_untransposed_weights(theta_per_model):
    """Vmapped over models that each have a theta (meta-training's particles, each with its own
    perturbed theta; or one theta broadcast to every model, as the evaluation trainer does), the
    block MLP's three products (first layer [B, H, c], hidden [B, H, c], output [B, 2, c]) are
    batched products contracting the weights' last dimension, the layout XLA's CPU backend runs as
    a GEMM. Checked in the compiled program, and the vmapped update equals each model's own update."""
    import re
    lo = lopt.MLPLOpt(hidden_size=16, chunk_size=64)
    models = 3
    if theta_per_model == "own":
        thetas = jax.vmap(lo.init)(jax.random.split(jax.random.key(0), models))
    else:
        thetas = jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (models,) + x.shape), lo.init(jax.random.key(0)))
    params = {"w": jax.random.normal(jax.random.key(1), (models, 16, 16))}  # 256 parameters: 4 blocks of 64
    grads = jax.tree_util.tree_map(lambda p: 0.1 * jnp.sin(p), params)

    def update(theta, g, p):
        tx = lo.opt_fn(theta, is_training=True)
        return tx.update(g, tx.init(p), p)[0]

    fn = jax.jit(jax.vmap(update))
    hlo = fn.lower(thetas, grads, params).compile().as_text()
    dims = re.findall(r"= f32\[3,(?:16|2),64\]\{[0-9,]+\} dot\([^\n]*?lhs_batch_dims=\{0\}, lhs_contracting_dims=\{(\d)\}", hlo)
    assert len(dims) >= 3 and set(dims) == {"2"}, dims
    got = fn(thetas, grads, params)
    for i in range(models):
        theta_i, p_i, g_i = (jax.tree_util.tree_map(lambda x: x[i], t) for t in (thetas, params, grads))
        chex.assert_trees_all_close(jax.tree_util.tree_map(lambda x: x[i], got), update(theta_i, g_i, p_i),
                                    rtol=1e-5, atol=1e-9)


def test_vmapped_update_with_a_shared_theta():
    """Vmapped over models with one shared theta (`in_axes=None`): each model's own update."""
    lo = lopt.MLPLOpt(hidden_size=16, chunk_size=64)
    theta = lo.init(jax.random.key(0))
    params = {"w": jax.random.normal(jax.random.key(1), (3, 16, 16))}
    grads = jax.tree_util.tree_map(lambda p: 0.1 * jnp.sin(p), params)

    def update(g, p):
        tx = lo.opt_fn(theta)
        return tx.update(g, tx.init(p), p)[0]

    got = jax.jit(jax.vmap(update))(grads, params)
    for i in range(3):
        g_i, p_i = ({"w": t["w"][i]} for t in (grads, params))
        chex.assert_trees_all_close(jax.tree_util.tree_map(lambda x: x[i], got), update(g_i, p_i), rtol=1e-5, atol=1e-9)

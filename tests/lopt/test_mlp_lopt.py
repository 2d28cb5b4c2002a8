"""MLPLOpt against a direct transcription of its documented math (no folding, no blocking)."""
import contextlib

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lopt
from lopt.features import step_embedding


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


def test_block_size_follows_the_devices_unless_given():
    """An update of one model: the 32768 block; an update batched over many models
    (`features.batched_updates()`) on one CPU device (the test process): the 4096 block; an
    explicit chunk_size wins; 0 is refused. (Several CPU devices give 1024 batched:
    tests/outer_trainers/test_devices.py.)"""
    from lopt import features as ft
    assert len(jax.local_devices()) == 1 or jax.local_devices()[0].platform != "cpu"
    assert ft.default_block_size() == ft.default_block_size(batched=False) == ft.BLOCK_UNBATCHED == 32768
    assert ft.default_block_size(batched=True) == ft.BLOCK_ONE_DEVICE == 4096
    assert lopt.MLPLOpt().block_size == 32768 and lopt.MLPLOpt(chunk_size=300).block_size == 300
    with ft.batched_updates():
        assert ft.default_block_size() == lopt.MLPLOpt().block_size == 4096
        assert ft.default_block_size(batched=False) == 32768 and lopt.MLPLOpt(chunk_size=300).block_size == 300
    assert ft.default_block_size() == 32768  # the context is left
    assert "chunk_size" not in lopt.MLPLOpt().config()
    with pytest.raises(ValueError, match="chunk_size >= 1"):
        lopt.MLPLOpt(chunk_size=0)


def test_batched_update_runs_in_the_batched_blocks():
    """`opt_fn` called inside `features.batched_updates()` (as LOptTruncatedStep and the evaluation
    trainer call it) blocks a 10,000-parameter tensor in the batched 4096 blocks (a loop); called
    outside, in one 32768 block (no loop); both compute the same update."""
    from lopt import features as ft
    lo = lopt.MLPLOpt(hidden_size=8)
    theta = lo.init(jax.random.key(0))
    params = {"w": jax.random.normal(jax.random.key(1), (100, 100))}
    grads = jax.tree_util.tree_map(lambda p: 0.1 * jnp.sin(p), params)
    outs, loops = [], []
    for batched in (True, False):
        with ft.batched_updates() if batched else contextlib.nullcontext():
            tx = lo.opt_fn(theta, is_training=batched)
        fn = jax.jit(tx.update)
        loops.append(" while(" in fn.lower(grads, tx.init(params), params).compile().as_text())
        outs.append(fn(grads, tx.init(params), params)[0])
    assert loops == [True, False]
    chex.assert_trees_all_close(outs[0], outs[1], rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("shared_theta", [False, True])
def test_vmapped_update_multiplies_untransposed_weights(shared_theta):
    """Vmapped over models (meta-training's particles, each with its own perturbed theta; or the
    evaluation trainer's tasks, sharing one theta), the block MLP's three products (first layer
    [B, H, c], hidden [B, H, c], output [B, 2, c]) are batched products contracting the weights'
    last dimension, the layout XLA's CPU backend runs as a GEMM. With the hidden and output
    weights transposed inside the product it ran them as its generic batched dot (PES on the
    benchmark's problem (d) 16% slower); with one shared theta it transposed the activations
    around an unbatched product (problem (d)'s floor 20% slower). Checked in the compiled program,
    and the vmapped update still equals each model's own update."""
    import re
    from lopt import features as ft
    lo = lopt.MLPLOpt(hidden_size=16, chunk_size=64)
    models = 3
    thetas = lo.init(jax.random.key(0)) if shared_theta else jax.vmap(lo.init)(jax.random.split(jax.random.key(0), models))
    params = {"w": jax.random.normal(jax.random.key(1), (models, 16, 16))}  # 256 parameters: 4 blocks of 64
    grads = jax.tree_util.tree_map(lambda p: 0.1 * jnp.sin(p), params)

    def update(theta, g, p):
        with ft.batched_updates():
            tx = lo.opt_fn(theta, is_training=True)
        return tx.update(g, tx.init(p), p)[0]

    fn = jax.jit(jax.vmap(update, in_axes=(None if shared_theta else 0, 0, 0)))
    hlo = fn.lower(thetas, grads, params).compile().as_text()
    dims = re.findall(r"= f32\[3,(?:16|2),64\]\{[0-9,]+\} dot\([^\n]*?lhs_batch_dims=\{0\}, lhs_contracting_dims=\{(\d)\}", hlo)
    assert len(dims) >= 3 and set(dims) == {"2"}, dims
    got = fn(thetas, grads, params)
    for i in range(models):
        theta_i = thetas if shared_theta else jax.tree_util.tree_map(lambda x: x[i], thetas)
        p_i, g_i = ({"w": t["w"][i]} for t in (params, grads))
        chex.assert_trees_all_close(jax.tree_util.tree_map(lambda x: x[i], got), update(theta_i, g_i, p_i),
                                    rtol=1e-5, atol=1e-9)


def test_vary_like_keeps_the_value_and_takes_the_batch():
    """`vary_like(x, ref)` is x for any ref (NaN and infinities included) and, under vmap, has
    ref's batch dimension; its gradient with respect to x is the identity."""
    from lopt.mlp_lopt import vary_like
    x = jnp.arange(6.0).reshape(2, 3)
    refs = jnp.asarray([0.5, jnp.nan, jnp.inf, -jnp.inf])
    out = jax.vmap(vary_like, in_axes=(None, 0))(x, refs)
    chex.assert_shape(out, (4, 2, 3))
    chex.assert_trees_all_equal(out, jnp.broadcast_to(x, (4, 2, 3)))
    chex.assert_trees_all_equal(vary_like(x, jnp.asarray(jnp.nan)), x)
    chex.assert_trees_all_equal(jax.grad(lambda x: jnp.sum(vary_like(x, jnp.asarray(jnp.nan)) * 2.0))(x),
                                jnp.full_like(x, 2.0))

"""AdafacMLPLOpt's feature mean squares: every code path (per-feature, analytic matrix, blocks of
rows with a shorter last block) equals the direct mean of each squared feature."""
import chex
import jax
import jax.numpy as jnp
import pytest

import lopt.archs.adafac_mlp_lopt as am


def _accum(shape, key):
    k = jax.random.split(key, 4)
    rows, cols = (shape[:-1], shape[:-2] + shape[-1:]) if len(shape) >= 2 else (shape, ())
    return am.LeafAccum(jax.random.uniform(k[0], (3,) + shape), jax.random.uniform(k[1], shape),
                        jax.random.uniform(k[2], (3,) + rows) + 0.1, jax.random.uniform(k[3], (3,) + cols) + 0.1)


@pytest.mark.parametrize("shape,block,min_blocks", [
    ((7,), 8, 2),              # vector: one reduction per feature
    ((3, 4, 5), 8, 2),         # rank 3: analytic (einsum) path
    ((37, 5), 1000, 2),        # matrix within one block: analytic (matmul) path
    ((37, 5), 40, 16),         # fewer than min_blocks blocks: analytic path
    ((37, 5), 40, 2),          # 4 blocks of 8 rows, then the 5 rows left
    ((37, 5), 5, 2),           # one row per block
    ((40, 5), 40, 2),          # 5 blocks of 8 rows, none left
])
def test_feature_mean_squares_paths(shape, block, min_blocks):
    k = jax.random.split(jax.random.key(0), 3)
    g, p, acc = jax.random.normal(k[0], shape), jax.random.normal(k[1], shape), _accum(shape, k[2])
    got = jax.jit(lambda g, p, acc: am.feature_mean_squares(g, p, acc, block, min_blocks))(g, p, acc)
    # the reference in one jitted program too (op by op it compiles each feature's ops: minutes on 2 cores)
    want = jax.jit(lambda g, p, acc: jnp.stack([jnp.mean(jnp.square(x))
                                                for x in jnp.broadcast_arrays(*am.leaf_features(g, p, acc))]))(g, p, acc)
    chex.assert_shape(got, (am.num_leaf_features(3, 3),))
    chex.assert_trees_all_close(got, want, rtol=2e-6)

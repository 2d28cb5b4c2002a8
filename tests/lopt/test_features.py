"""lopt.features' blockwise sums: the same sum as the whole axis's, split only when there are
enough blocks; and `updates_are_batched`, which tells optimizers built inside `batched_updates()`."""
import chex
import jax
import jax.numpy as jnp
import pytest

import lopt
from lopt import features as ft


def _sum_of_squares(x, sizes):
    """fn of `blockwise_sum` over the last axis of x ([..., n] -> [2]: Σx², Σx), recording the
    block sizes it is traced with."""
    def fn(start, size):
        sizes.append(size)
        blk = jax.lax.dynamic_slice_in_dim(x, start, size, axis=x.ndim - 1)
        return jnp.stack([jnp.sum(jnp.square(blk)), jnp.sum(blk)])
    return fn


@pytest.mark.parametrize("n,c,min_blocks,traced", [
    (103, 10, 2, [10, 3]),    # 10 full blocks in a map (traced once), then the 3 left
    (100, 10, 2, [10]),       # no elements left over
    (103, 10, 11, [103]),     # fewer than min_blocks blocks: the whole axis at once
    (15, 10, 1, [15]),        # one full block is never split off
])
def test_blockwise_sum_equals_the_whole_sum(n, c, min_blocks, traced):
    x = jax.random.normal(jax.random.key(0), (3, n))
    sizes = []
    got = jax.jit(lambda x: ft.blockwise_sum(_sum_of_squares(x, sizes), n, c, min_blocks))(x)
    chex.assert_trees_all_close(got, jnp.stack([jnp.sum(jnp.square(x)), jnp.sum(x)]), rtol=1e-5)
    assert sizes == traced


def test_blockwise_sum_under_vmap():
    """Batched over models (as meta-training's particles run it), each model's own sum."""
    x = jax.random.normal(jax.random.key(1), (4, 2, 57))
    got = jax.jit(jax.vmap(lambda x: ft.blockwise_sum(_sum_of_squares(x, []), 57, 5, 2)))(x)
    chex.assert_trees_all_close(got, jnp.stack([jnp.sum(jnp.square(x), axis=(1, 2)), jnp.sum(x, axis=(1, 2))], 1),
                                rtol=1e-5)


def test_default_blocks_and_the_batched_context():
    """`blockwise_sum`'s default: 131072-element blocks from 16 blocks (2M elements) on, the whole
    axis below; `updates_are_batched` tells whether `batched_updates()` is entered."""
    assert ft.SUM_BLOCK == 131072 and ft.SUM_MIN_BLOCKS == 16
    sizes = []
    for n in (16 * 131072 - 1, 16 * 131072 + 5):
        x = jnp.ones((1, n))
        jax.eval_shape(lambda x: ft.blockwise_sum(_sum_of_squares(x, sizes), x.shape[1]), x)
    assert sizes == [16 * 131072 - 1, 131072, 5]
    assert not ft.updates_are_batched()
    with ft.batched_updates():
        assert ft.updates_are_batched()
    assert not ft.updates_are_batched()


def test_sharded_updates_choose_the_per_core_block_for_batched_updates_only():
    """Inside `sharded_updates(D)` with D > 1 (a batch sharded over CPU devices), a batched update's
    block is `BLOCK_PER_CORE`; with D = 1, or outside it, `BLOCK_ONE_DEVICE`; an unbatched update
    keeps `BLOCK_UNBATCHED` either way; the contexts are left as they were."""
    assert jax.local_devices()[0].platform == "cpu"
    with ft.sharded_updates(4):
        assert ft.default_block_size(batched=True) == ft.BLOCK_PER_CORE == 1024
        assert ft.default_block_size(batched=False) == ft.BLOCK_UNBATCHED
        with ft.sharded_updates(1):
            assert ft.default_block_size(batched=True) == ft.BLOCK_ONE_DEVICE
        with ft.batched_updates():
            assert ft.default_block_size() == lopt.MLPLOpt().block_size == ft.BLOCK_PER_CORE
    assert ft.default_block_size(batched=True) == ft.BLOCK_ONE_DEVICE == 4096

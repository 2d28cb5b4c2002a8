"""lopt.parts.layout: blockwise sums (the same sum as the whole axis's, split only when there are
enough blocks), blockwise maps (the same values in every block size), `block_size`, a function of
a tensor's size and the layout alone, and the layouts' names."""
import chex
import jax
import jax.numpy as jnp
import pytest

from lopt.parts import layout as ft
from lopt.parts.layout import ACCELERATOR, CPU, UpdateLayout


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
    got = jax.jit(lambda x: CPU.blockwise_sum(_sum_of_squares(x, sizes), n, c, min_blocks))(x)
    chex.assert_trees_all_close(got, jnp.stack([jnp.sum(jnp.square(x)), jnp.sum(x)]), rtol=1e-5)
    assert sizes == traced


def test_blockwise_sum_under_vmap():
    """Batched over models (as meta-training's particles run it), each model's own sum."""
    x = jax.random.normal(jax.random.key(1), (4, 2, 57))
    got = jax.jit(jax.vmap(lambda x: CPU.blockwise_sum(_sum_of_squares(x, []), 57, 5, 2)))(x)
    chex.assert_trees_all_close(got, jnp.stack([jnp.sum(jnp.square(x), axis=(1, 2)), jnp.sum(x, axis=(1, 2))], 1),
                                rtol=1e-5)


def test_default_sum_blocks():
    """`blockwise_sum`'s default: 131072-element blocks from 16 blocks (2M elements) on, the whole
    axis below."""
    assert CPU.sum_block == 131072 and CPU.sum_min_blocks == 16
    sizes = []
    for n in (16 * 131072 - 1, 16 * 131072 + 5):
        x = jnp.ones((1, n))
        jax.eval_shape(lambda x: CPU.blockwise_sum(_sum_of_squares(x, sizes), x.shape[1]), x)
    assert sizes == [16 * 131072 - 1, 131072, 5]


def test_block_size_is_a_function_of_the_size():
    """n < 2048: one block of n; then about n / 16 in multiples of 1024, from 1024 to 32768; always
    1 ≤ c ≤ n. No context, device count or caller changes it."""
    assert [CPU.block_size(n) for n in (1, 1000, 2047)] == [1, 1000, 2047]
    assert [CPU.block_size(n) for n in (2048, 8192, 16384, 42_634, 196_608, 802_816, 6_291_456)] == [
        1024, 1024, 1024, 2048, 12288, 32768, 32768]
    for n in range(1, 300_000, 997):
        c = CPU.block_size(n)
        assert 1 <= c <= n and (c == n or c % CPU.min_block == 0) and c <= CPU.max_block, (n, c)


@pytest.mark.parametrize("n,c", [(10, 10), (10, 3), (64, 16), (1000, 300)])
def test_blockwise_map_is_the_same_in_every_block_size(n, c):
    """[out_rows, n] from the (possibly overlapping) blocks of `block_starts`: the values of fn on
    the whole axis at once (to float32 rounding), inside jit and under vmap."""
    x = jax.random.normal(jax.random.key(2), (4, n))
    w = jax.random.normal(jax.random.key(3), (2, 4))
    fn = lambda x: lambda s: jnp.tanh(w @ jax.lax.dynamic_slice_in_dim(x, s, c, axis=1))
    whole = jnp.tanh(w @ x)
    chex.assert_trees_all_close(jax.jit(lambda x: ft.blockwise_map(fn(x), n, c, 2))(x), whole, rtol=1e-6, atol=1e-7)
    xs = jnp.stack([x, 2 * x])
    got = jax.jit(jax.vmap(lambda x: ft.blockwise_map(fn(x), n, c, 2, like=x[0])))(xs)
    chex.assert_trees_all_close(got, jnp.stack([whole, jnp.tanh(w @ (2 * x))]), rtol=1e-6, atol=1e-7)


def test_accelerator_blocks():
    """The accelerator layout: blocks of up to 2^22 parameters for the per-parameter MLPs, whatever
    the CPU block asked for, and each sum over a whole tensor at once."""
    assert [ACCELERATOR.block_size(n) for n in (1, 2048, 6_291_456, 50_000_000)] == [1, 2048, 4_194_304, 4_194_304]
    assert ACCELERATOR.fixed_block(16384) == ACCELERATOR.max_block == 1 << 22
    sizes = []
    x = jnp.ones((1, 100))
    total = ACCELERATOR.blockwise_sum(_sum_of_squares(x, sizes), 100, c=2, min_blocks=2)
    assert sizes == [100] and float(total[0]) == 100.0
    assert CPU.block_size(6_291_456) == CPU.max_block and CPU.fixed_block(16384) == 16384


def test_layouts_are_named_static_values():
    """A layout is resolved from its name (or given as an UpdateLayout), hashes by value, and an
    unknown name is refused naming the known ones; platforms map to names."""
    assert ft.resolve("cpu") is CPU and ft.resolve("accelerator") is ACCELERATOR
    custom = UpdateLayout("mine", sum_block=2)
    assert ft.resolve(custom) is custom and hash(custom) == hash(UpdateLayout("mine", sum_block=2))
    with pytest.raises(ValueError, match="unknown update layout 'gpu'.*accelerator"):
        ft.resolve("gpu")
    with pytest.raises(ValueError, match="min_block"):
        UpdateLayout("bad", min_block=0)
    assert [ft.for_platform(p) for p in ("cpu", "gpu", "tpu")] == ["cpu", "accelerator", "accelerator"]


def test_architectures_hold_their_layout():
    """The layout is an architecture's static option: shown in its repr when not "cpu", not part of
    its config, equality or hash (it changes speed, not the function), refused when unknown."""
    import lopt
    gpu = lopt.Celo2LOpt(layout="accelerator")
    assert "layout='accelerator'" in repr(gpu) and "layout" not in repr(lopt.Celo2LOpt())
    assert gpu == lopt.Celo2LOpt() and "layout" not in gpu.config() and gpu.update_layout is ACCELERATOR
    with pytest.raises(ValueError, match="unknown update layout"):
        lopt.MLPLOpt(layout="tpu")

"""The update layout: how a learned optimizer's per-parameter work is cut into blocks.

A learned update runs a small MLP (and several reductions) over every element of every tensor.
How that work is cut into blocks changes the program's speed and its float32 summation order,
never the function computed: blocks are computed independently and assembled (`blockwise_map`)
or summed (`blockwise_sum`).

The right cut depends on the platform. On a CPU a block's activations should stay in a core's
cache, so big tensors run as a loop over cache-sized blocks; on an accelerator every loop
iteration is a kernel launch of its own, so tensors run in blocks as large as memory allows and
per-tensor sums reduce whole tensors. That choice is an `UpdateLayout`, a static value an
architecture holds (its `layout` option, "cpu" by default) and passes down; nothing here reads
the platform while an update is traced. `for_platform` maps a platform name to a layout, and
`lopt.pretrained.load` resolves it once, when it builds the transform, from jax's default
backend.

    layout = resolve("cpu")                 # or "accelerator", or an UpdateLayout
    c = layout.block_size(n)                # elements per block of a tensor of n elements
    total = layout.blockwise_sum(fn, n)     # Σ over blocks of fn(start, size)

Sharded parameters. Cutting a tensor into blocks flattens it, which a tensor split over the devices
of a mesh does not allow (an explicit mesh refuses the reshape; automatic sharding gathers the
tensor). So a tensor whose type names a mesh axis (`is_sharded`: under `jax.set_mesh` of a mesh
with `AxisType.Explicit` axes) is computed in its own shape, and so is every tensor with the
"sharded" layout (`SHARDED`, for automatic sharding, where the type does not tell): elementwise work
on the whole tensor, per-tensor sums over all its axes (`UpdateLayout.keeps_shape`). Work that needs
the whole tensor on each device (a Newton–Schulz orthogonalization) gathers it and splits the result
back as the parameter is split (`gathered`).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional, Union

import jax
import jax.numpy as jnp

__all__ = ["UpdateLayout", "CPU", "ACCELERATOR", "SHARDED", "LAYOUTS", "resolve", "for_platform", "block_starts",
           "blockwise_map", "is_sharded", "gathered"]


@dataclasses.dataclass(frozen=True)
class UpdateLayout:
    """How per-parameter work is cut into blocks (module docstring). Frozen, hashed by value.

    Attributes:
      name: "cpu", "accelerator", or a name of the user's own.
      cache_sized: True: blocks sized for a CPU's caches (`block_size`'s formula, sums block by
        block); False: blocks of up to `max_block` elements and per-tensor sums taken whole.
      min_block: with `cache_sized`, the smallest block of a tensor of ≥ 2·min_block elements.
      max_block: the largest block.
      blocks_per_tensor: with `cache_sized`, how many blocks a mid-sized tensor is cut into.
      sum_block: with `cache_sized`, elements per block of `blockwise_sum`.
      sum_min_blocks: with `cache_sized`, the fewest full blocks worth splitting a sum into
        (fewer: the sum is taken whole).
      keep_shape: compute every tensor in its own shape, never flattened into blocks (the
        "sharded" layout: updates keep each parameter's sharding under automatic sharding).
    """
    name: str = "cpu"
    cache_sized: bool = True
    min_block: int = 1024
    max_block: int = 32768
    blocks_per_tensor: int = 16
    sum_block: int = 131072
    sum_min_blocks: int = 16
    keep_shape: bool = False

    def __post_init__(self) -> None:
        if not (self.min_block >= 1 and self.max_block >= self.min_block and self.blocks_per_tensor >= 1
                and self.sum_block >= 1 and self.sum_min_blocks >= 1):
            raise ValueError(f"UpdateLayout needs 1 <= min_block <= max_block and blocks_per_tensor, sum_block, "
                             f"sum_min_blocks >= 1, got {self}")

    def block_size(self, n: int) -> int:
        """Elements per block of a tensor of n elements, for the per-parameter MLPs.

            c = n                                                        if n < 2 · min_block
            c = min(n, clip(⌊n / blocks_per_tensor⌋ rounded down to a multiple of min_block,
                            min_block, max_block))                        otherwise
            c = min(n, max_block)                                        without `cache_sized`

        With the CPU layout: the tensors of a few thousand parameters of the small models that
        meta-training vmaps over many particles get blocks of 1024 (a batch of blocks stays in
        cache), the million-parameter tensors of a model trained on its own blocks of 32768.

        Args:
          n: the tensor's number of elements (≥ 1).

        Returns:
          c, with 1 ≤ c ≤ n for n ≥ 1 (a function of n and the layout alone).
        """
        if not self.cache_sized:
            return min(n, self.max_block)
        if n < 2 * self.min_block:  # one block: two would overlap by most of a block
            return n
        c = (n // self.blocks_per_tensor) // self.min_block * self.min_block
        return min(n, max(self.min_block, min(self.max_block, c)))

    def fixed_block(self, block: int) -> int:
        """An architecture's own block size (elements), or `max_block` without `cache_sized`.

        Args:
          block: the block an architecture chose for a CPU's caches.

        Returns:
          the block to use in this layout.
        """
        return block if self.cache_sized else self.max_block

    def blockwise_sum(self, fn, n: int, c: Optional[int] = None, min_blocks: Optional[int] = None) -> jax.Array:
        """Σ_b fn(start_b, size_b) over consecutive, non-overlapping blocks covering [0, n).

        The floor(n / c) blocks of c elements run in one `lax.map` (fn traced once for all of
        them), then a last block of the n mod c elements left; with fewer than `min_blocks` blocks,
        or without `cache_sized`, the axis is one block, fn(0, n). The value is the whole-axis
        sum's up to float32 summation order.

        Args:
          fn: (start, size) -> an array, the same shape for every block: the partial sum over
            elements start .. start + size − 1 of the axis (start traced, size static).
          n: the length of the summed axis.
          c: elements per block; None: `sum_block`.
          min_blocks: the fewest full blocks worth splitting the axis into; None: `sum_min_blocks`.

        Returns:
          The sum of fn over the blocks.
        """
        if not self.cache_sized:
            return fn(0, n)
        c = max(int(self.sum_block if c is None else c), 1)
        full, tail = divmod(n, c)
        if full < max(self.sum_min_blocks if min_blocks is None else min_blocks, 2):
            return fn(0, n)
        total = jnp.sum(jax.lax.map(lambda i: fn(i * c, c), jnp.arange(full, dtype=jnp.int32)), axis=0)
        return total + fn(full * c, tail) if tail else total


    def keeps_shape(self, x: Any) -> bool:
        """Whether a tensor is computed in its own shape: with `keep_shape`, or when it is sharded
        over an explicit mesh (`is_sharded`). Static: read from the layout and x's type.

        Args:
          x: the tensor (an array or tracer).

        Returns:
          a Python bool.
        """
        return self.keep_shape or is_sharded(x)


def is_sharded(x: Any) -> bool:
    """Whether x's type splits an axis over a mesh axis (explicit sharding, `jax.set_mesh`).

    Under automatic sharding, and on one device, the type names no mesh axis: False.

    Args:
      x: an array, tracer, Python number or `jax.ShapeDtypeStruct`.

    Returns:
      a Python bool (static under jit).
    """
    try:
        spec = jax.typeof(x).sharding.spec
    except (AttributeError, TypeError):
        return False
    return any(axis is not None for axis in spec)


def gathered(fn, x: jax.Array) -> jax.Array:
    """fn(x) for work that needs all of x on each device, e.g. a Newton–Schulz orthogonalization.

    A tensor sharded over an explicit mesh (`is_sharded`) is gathered (`jax.sharding.reshard` to
    replicated), fn runs on the whole tensor on every device, and the result is split back as x
    is (each device keeps its part: memory of one whole tensor per device while fn runs, fn's
    compute repeated on every device). Otherwise fn(x).

    Args:
      fn: x -> an array of x's shape.
      x: the tensor.

    Returns:
      fn(x), sharded as x.
    """
    if not is_sharded(x):
        return fn(x)
    spec = jax.typeof(x).sharding.spec
    whole = jax.sharding.reshard(x, jax.sharding.PartitionSpec())
    return jax.sharding.reshard(fn(whole), spec)


CPU = UpdateLayout("cpu")
# On an accelerator a per-parameter MLP runs on blocks of up to 2^22 elements (bounding its
# temporaries, [F + H, c] float32, for tensors of any size) and sums reduce whole tensors.
ACCELERATOR = UpdateLayout("accelerator", cache_sized=False, max_block=1 << 22)
# Every tensor in its own shape, for parameters sharded over several devices under automatic sharding.
SHARDED = UpdateLayout("sharded", cache_sized=False, keep_shape=True)
LAYOUTS = {"cpu": CPU, "accelerator": ACCELERATOR, "sharded": SHARDED}


def resolve(layout: Union[str, UpdateLayout]) -> UpdateLayout:
    """The `UpdateLayout` a name stands for ("cpu", "accelerator"), or the layout itself.

    Args:
      layout: a name of `LAYOUTS` ("cpu", "accelerator", "sharded") or an `UpdateLayout`.

    Returns:
      The layout.

    Raises:
      ValueError: an unknown name.
    """
    if isinstance(layout, UpdateLayout):
        return layout
    if layout not in LAYOUTS:
        raise ValueError(f"unknown update layout {layout!r}: use one of {sorted(LAYOUTS)} or a "
                         f"lopt.parts.layout.UpdateLayout")
    return LAYOUTS[layout]


def for_platform(platform: str) -> str:
    """The layout name for a jax platform: "cpu" for "cpu", "accelerator" for any other ("gpu", "tpu", ...).

    Args:
      platform: a jax platform name, e.g. `jax.default_backend()` or `device.platform`.

    Returns:
      "cpu" or "accelerator".
    """
    return "cpu" if platform == "cpu" else "accelerator"


def block_starts(n: int, c: int) -> jax.Array:
    """Start offsets of the ceil(n / c) blocks of c ≤ n elements covering [0, n); the last one
    is moved back to n − c (overlapping its predecessor) so that every block is full."""
    return jnp.minimum(jnp.arange(-(-n // c), dtype=jnp.int32) * c, n - c)


def blockwise_map(fn, n: int, c: int, out_rows: int, like: Optional[Any] = None) -> jax.Array:
    """[out_rows, n] assembled from fn(start) -> [out_rows, c] over the blocks of `block_starts`, in place.

    The blocks run in one `fori_loop` (fn is traced once, so a tensor of many blocks compiles no
    bigger than one of two). Inside `shard_map`, where fn's values vary over the mesh axis, the
    loop's carry must vary too: pass `like`, an [n] array of fn's inputs (e.g. the gradient), and
    the carry starts as `0 · like` (its values are all overwritten by the blocks).
    """
    starts = block_starts(n, c)
    if starts.shape[0] == 1:
        return fn(starts[0])

    def body(i, out):
        return jax.lax.dynamic_update_slice_in_dim(out, fn(starts[i]), starts[i], axis=1)

    out = jnp.zeros((out_rows, n), jnp.float32)
    if like is not None:
        out = out + 0.0 * jnp.asarray(like, jnp.float32).reshape(1, n)
    return jax.lax.fori_loop(0, starts.shape[0], body, out)

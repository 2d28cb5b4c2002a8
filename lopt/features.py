"""Per-tensor feature helpers shared by the learned optimizers.

Conventions: optimizer state is float32 whatever the parameter dtype; a "tensor" is one leaf
of the params pytree; statistics "per tensor" reduce over every axis of that leaf.

- `step_embedding(t)`      tanh(t/τ − 1) for τ in timescales                      [T]
- `progress_features(t, N)` (min(t/N, 1), log1p(N)/10, 1) or zeros if N is None     [3]
- `loss_features(ℓ, s)`    (has_loss, tanh((ℓ − ℓ̄)/(|ℓ̄| + 1e-6)))                  [2]
- `context_features`, `tensor_lstm_inputs`: the inputs of the per-tensor LSTMs (RNNMLPLOpt,
  NNAdam, HyperLOpt)
- `block_starts`, `blockwise_map`: full, possibly overlapping blocks of a long axis, for
  per-block work that keeps its temporaries in cache; `block_size(n)`, the block of a tensor
  of n parameters (a function of n alone)
- `blockwise_sum`: a sum over a long axis (the per-tensor feature statistics) taken block by
  block, so each block's several reductions read it from cache
- `prior_schedule(name, t, N)`: the fixed schedule a learned step size multiplies: 1
  ("constant") or a 5% linear warm-up then a cosine decay to 0 at the horizon N ("cosine")
- `EPS` (1e-8): added to a second moment before every square root / rsqrt of it
- `tree_mismatch`, `require_params`: the trace-time checks of `tx.update`'s inputs (and of theta,
  `LearnedOptimizer.check_theta`), naming the first leaf path that differs

The per-tensor RMS normalisation x_f / rms_f that the architectures apply to their features
is linear per feature, so they fold 1/rms_f into the rows of the first layer's weights:
(x ⊙ s) W = x (diag(s) W). That saves a whole pass over the [N, F] features.
"""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp

TIMESCALES = (1, 3, 10, 30, 100, 300, 1000, 3000, 10000, 30000, 100000)
NUM_PROGRESS = 3
NUM_LOSS = 2
EPS = 1e-8
SCHEDULES = ("constant", "cosine")
WARMUP_FRACTION = 0.05


def step_embedding(iteration: jax.Array, timescales: Sequence[float] = TIMESCALES) -> jax.Array:
    """tanh(t/τ − 1) for each τ: [T] float32."""
    t = jnp.asarray(iteration, jnp.float32)
    return jnp.tanh(t / jnp.asarray(timescales, jnp.float32) - 1.0)


def progress_features(iteration: jax.Array, num_steps: Optional[Any]) -> jax.Array:
    """Training-progress features [3]: (min(t/N, 1), log1p(N)/10, 1); zeros when N is None.

    `num_steps` may be a traced value (PES samples the horizon per particle)."""
    if num_steps is None:
        return jnp.zeros((NUM_PROGRESS,), jnp.float32)
    n = jnp.maximum(jnp.asarray(num_steps, jnp.float32), 1.0)
    t = jnp.asarray(iteration, jnp.float32)
    return jnp.stack([jnp.minimum(t / n, 1.0), jnp.log1p(n) / 10.0, jnp.ones((), jnp.float32)])


def horizon_scale(num_steps: Optional[Any], reference: int, power: float) -> jax.Array:
    """min(1, N_ref/N)^α: a step-size factor for horizons beyond a reference horizon.

    The optimal constant step size of a fixed-horizon run shrinks as the horizon grows (for
    convex Lipschitz losses η* ∝ 1/√N, α = ½); a learned step-size head meta-trained on horizons
    up to some N_max sees nothing of that beyond N_max. This factor is 1 up to N_ref and falls as
    a power of N past it, so a learned schedule keeps its meta-trained values on the horizons it
    was trained on and extrapolates by a fixed law past them.

    Args:
      num_steps: the horizon N (may be traced) or None.
      reference: N_ref ≥ 0; 0 turns the factor off.
      power: α ≥ 0.

    Returns:
      float32 []: min(1, N_ref/N)^α; 1 when `reference` is 0 or N is None.
    """
    if reference == 0 or num_steps is None:
        return jnp.ones((), jnp.float32)
    n = jnp.maximum(jnp.asarray(num_steps, jnp.float32), 1.0)
    return jnp.minimum(1.0, reference / n) ** power


def prior_schedule(name: str, iteration: jax.Array, num_steps: Optional[Any]) -> jax.Array:
    """σ(t, N), a fixed schedule over the horizon that a learned step size multiplies.

    Args:
      name: "constant" or "cosine" (`SCHEDULES`).
      iteration: t, int32 [] (the number of updates before this one).
      num_steps: the horizon N (may be traced) or None.

    Returns:
      float32 []: 1 for "constant" or N None; for "cosine", min((t+1)/w, 1) · ½(1 + cos(π·min(t/N, 1)))
      with w = max(1, ⌈`WARMUP_FRACTION` · N⌉).
    """
    if name not in SCHEDULES:
        raise ValueError(f"unknown schedule {name!r}; known: {SCHEDULES}")
    if name == "constant" or num_steps is None:
        return jnp.ones((), jnp.float32)
    n = jnp.maximum(jnp.asarray(num_steps, jnp.float32), 1.0)
    t = jnp.asarray(iteration, jnp.float32)
    warm = jnp.minimum((t + 1.0) / jnp.maximum(1.0, jnp.ceil(WARMUP_FRACTION * n)), 1.0)
    return warm * 0.5 * (1.0 + jnp.cos(jnp.pi * jnp.minimum(t / n, 1.0)))


def loss_features(loss: Optional[Any], loss_state: jax.Array) -> tuple[jax.Array, jax.Array]:
    """([has_loss, tanh((ℓ − ℓ̄)/(|ℓ̄| + 1e-6))], new loss_state).

    loss_state = [ℓ̄, seen]: ℓ̄ an EMA (decay 0.9) of the loss started at the first loss seen.
    Without a loss (ℓ = None) both features are 0 and the state is unchanged, so architectures
    that read the loss still work in training loops that do not pass one."""
    if loss is None:
        return jnp.zeros((NUM_LOSS,), jnp.float32), loss_state
    loss = jnp.asarray(loss, jnp.float32).reshape(())
    ema = jnp.where(loss_state[1] > 0, loss_state[0], loss)
    rel = jnp.tanh((loss - ema) / (jnp.abs(ema) + 1e-6))
    new_state = jnp.stack([0.9 * ema + 0.1 * loss, jnp.ones((), jnp.float32)])
    return jnp.stack([jnp.ones((), jnp.float32), rel]), new_state


def init_loss_state() -> jax.Array:
    """The loss state of `loss_features` before any loss was seen: [ℓ̄, seen] = [0, 0], float32 [2]."""
    return jnp.zeros((2,), jnp.float32)


def leaf_path(path: tuple) -> str:
    """A leaf's path as jax writes it (e.g. "['layer']['w']"); "(the root)" for a lone leaf.

    Args:
      path: a key path from `jax.tree_util.tree_flatten_with_path`.

    Returns:
      The printable path.
    """
    return jax.tree_util.keystr(path) or "(the root)"


def tree_mismatch(got: Any, want: Any, want_name: str = "the expected tree", *,
                  check_dtypes: bool = False) -> Optional[str]:
    """The first difference between two pytrees' structures or leaf shapes, or None if they match.

    Shapes are static, so this is free inside jit / vmap / grad (it runs once, at trace time).

    Args:
      got: the pytree given (leaves: arrays, tracers, Python scalars or `jax.ShapeDtypeStruct`s).
      want: the pytree it must match.
      want_name: what `want` is, for the description (e.g. "the params").
      check_dtypes: also compare leaf dtypes (as jax sees them: a float64 numpy leaf is float32
        unless x64 is enabled); a leaf that is not an array or number then counts as a mismatch.

    Returns:
      None, or a description: "missing leaf PATH", "unexpected leaf PATH" (with how many more),
      "leaf PATH has shape S, but S' in WANT_NAME" (or "dtype D, but D'"), or the two tree
      structures when only their containers differ (e.g. a dict where a FrozenDict is expected).
    """
    got_leaves, got_def = jax.tree_util.tree_flatten_with_path(got)
    want_leaves, want_def = jax.tree_util.tree_flatten_with_path(want)
    if got_def != want_def:
        got_paths, want_paths = [leaf_path(p) for p, _ in got_leaves], [leaf_path(p) for p, _ in want_leaves]
        parts = []
        for kind, paths, others in (("missing", want_paths, got_paths), ("unexpected", got_paths, want_paths)):
            known = set(others)
            absent = [p for p in paths if p not in known]
            if absent:
                more = f" (and {len(absent) - 1} more)" if len(absent) > 1 else ""
                parts.append(f"{kind} leaf {absent[0]}{more}")
        return "; ".join(parts) or f"the same leaves in other containers: {got_def}, but {want_def} in {want_name}"
    for (path, g), (_, w) in zip(got_leaves, want_leaves):
        if tuple(jnp.shape(g)) != tuple(jnp.shape(w)):
            return f"leaf {leaf_path(path)} has shape {tuple(jnp.shape(g))}, but {tuple(jnp.shape(w))} in {want_name}"
        if check_dtypes:
            try:
                dtype = jnp.result_type(g)
            except TypeError:
                return f"leaf {leaf_path(path)} is a {type(g).__name__}, not an array"
            if dtype != jnp.result_type(w):
                return f"leaf {leaf_path(path)} has dtype {dtype}, but {jnp.result_type(w)} in {want_name}"
    return None


def check_grads_match_params(updates: Any, params: Any, name: str) -> None:
    """A clear error unless the gradients have the params' tree structure and leaf shapes.

    Args:
      updates: the gradients (or updates) given to `tx.update`.
      params: the parameters given to `tx.update`.
      name: the optimizer's name, for the message.

    Raises:
      ValueError: naming the first leaf path that differs (at trace time: no cost per step).
    """
    mismatch = tree_mismatch(updates, params, "the params")
    if mismatch is not None:
        raise ValueError(f"{name}: the gradients given to tx.update do not match the params: {mismatch}; "
                         f"pass gradients with the params' tree and leaf shapes (as jax.grad of a loss of "
                         f"the params returns them)")


def require_params(updates: Any, params: Any, name: str) -> None:
    """Learned optimizers read the parameters: a clear error when `tx.update` was given none, or
    params whose tree or leaf shapes differ from the gradients' (`check_grads_match_params`).

    Args:
      updates: the gradients given to `tx.update`.
      params: the parameters given to `tx.update` (required).
      name: the optimizer's name, for the message.
    """
    if params is None:
        raise ValueError(f"{name} needs params: call tx.update(grads, state, params)")
    check_grads_match_params(updates, params, name)


def leaves_of(tree: Any, *others: Any) -> tuple[Any, list, list[list]]:
    """(treedef, leaves of `tree`, leaves of each of `others` flattened up to `tree`)."""
    treedef = jax.tree_util.tree_structure(tree)
    return treedef, treedef.flatten_up_to(tree), [treedef.flatten_up_to(o) for o in others]


def zeros_like_f32(p: Any) -> jax.Array:
    """float32 zeros of p's shape: optimizer state is float32 whatever the parameter dtype."""
    return jnp.zeros(jnp.shape(p), jnp.float32)


def log_stat(x: jax.Array) -> jax.Array:
    """A scale-free summary for LSTM inputs: log(x + 1e-12) / 10 (x ≥ 0)."""
    return jnp.log(x + 1e-12) / 10.0


def context_features(iteration: jax.Array, timescales: Sequence[float], num_steps: Optional[Any],
                     loss_feats: jax.Array) -> jax.Array:
    """Inputs shared by every tensor's LSTM: [step embedding (T), progress (3), loss (2)]."""
    return jnp.concatenate([step_embedding(iteration, timescales), progress_features(iteration, num_steps), loss_feats])


def size_feature(p: Any) -> jax.Array:
    """log(1 + numel)/10: lets a per-tensor network tell a bias from a big matrix."""
    return jnp.asarray(math.log1p(math.prod(jnp.shape(p))) / 10.0, jnp.float32)


def tensor_lstm_inputs(stats: jax.Array, params: Sequence[Any], ctx: jax.Array) -> jax.Array:
    """Per-tensor LSTM inputs z [L, S + 1 + C]: [log_stat(stats) [L, S], size_feature [L, 1],
    the shared context ctx [C] repeated per tensor], for the L leaves `params`."""
    sizes = jnp.stack([size_feature(p) for p in params])[:, None]
    return jnp.concatenate([log_stat(stats), sizes, jnp.broadcast_to(ctx, (len(params), ctx.shape[0]))], axis=1)


# The blocks of a per-parameter MLP's column-major GEMMs (`block_size`). A block's activations
# are [H, c] per model, [B, H, c] when the update is vmapped over B models: small enough blocks
# keep them in a core's cache. Every block costs a loop iteration and the fixed overhead of its
# GEMM calls: large enough blocks amortise that over a big tensor.
MIN_BLOCK = 1024
MAX_BLOCK = 32768
BLOCKS_PER_TENSOR = 16
# On an accelerator every block is a loop iteration with kernel launches of its own, and caches
# are not what the blocks are for: there a per-parameter MLP runs on blocks of up to 2^22
# parameters (bounding its temporaries, [F + H, c] float32, for tensors of any size) and
# `blockwise_sum` reduces a tensor whole. On an H100 that halved Celo2LOpt's train step on a
# 10M-parameter MLP, 6.1 -> 3.1 ms (docs/benchmarks.md, "On a GPU").
ACCELERATOR_BLOCK = 1 << 22


def on_accelerator() -> bool:
    """Whether jax computes on an accelerator: its default backend is not the CPU.

    Read when an update is traced, to size the blocks of `block_size`, `platform_block` and
    `blockwise_sum`. The blocks are computed independently, so this changes the program's speed
    and its float32 rounding (as the CPU and the GPU round differently anyway), never the
    function computed.
    """
    return jax.default_backend() != "cpu"


def platform_block(block: int) -> int:
    """`block` (elements per block, chosen for a CPU's caches), or `ACCELERATOR_BLOCK` on an
    accelerator (`on_accelerator`)."""
    return ACCELERATOR_BLOCK if on_accelerator() else block


def block_size(n: int) -> int:
    """The parameters per block of a tensor of n parameters for the per-parameter MLPs' GEMMs.

        c = n                                                            if n < 2048
        c = min(n, clip(⌊n / 16⌋ rounded down to a multiple of 1024, 1024, 32768))  otherwise
        c = min(n, 2^22)                                                 on an accelerator

    On the CPU a function of the tensor's static size alone: the tensors of a few thousand parameters of the
    small models that meta-training runs vmapped over many particles get blocks of 1024
    parameters (a batch of blocks stays in cache), the million-parameter tensors of a model
    trained on its own blocks of 32768 (few loop iterations). The blocks of `blockwise_map` are
    computed independently, so c changes speed, not the function computed: the values agree up
    to float32 rounding (XLA may round GEMMs of other widths differently). An architecture's
    `chunk_size` overrides it.

    Args:
      n: the tensor's number of parameters (≥ 1).

    Returns:
      c, with 1 ≤ c ≤ n for n ≥ 1.
    """
    if on_accelerator():
        return min(n, ACCELERATOR_BLOCK)
    if n < 2 * MIN_BLOCK:  # one block: two would overlap by most of a block
        return n
    c = (n // BLOCKS_PER_TENSOR) // MIN_BLOCK * MIN_BLOCK
    return min(n, max(MIN_BLOCK, min(MAX_BLOCK, c)))


# Per-tensor sums (`blockwise_sum`). An architecture's per-tensor statistics are several
# reductions of the same accumulators (MLPLOpt: the F = 11 sums of squares of g, p, the momenta
# and v). Over a whole big tensor each reduction streams it from memory again; block by block, a
# block's reductions read it from cache. Tensors of fewer than SUM_MIN_BLOCKS blocks (up to 2M
# parameters) are reduced whole.
SUM_BLOCK = 131072
# `blockwise_sum` reduces an axis of fewer than this many blocks whole
SUM_MIN_BLOCKS = 16


def blockwise_sum(fn, n: int, c: Optional[int] = None, min_blocks: Optional[int] = None) -> jax.Array:
    """Σ_b fn(start_b, size_b) over consecutive, non-overlapping blocks covering [0, n).

    The floor(n / c) blocks of c elements run in one `lax.map` (fn traced once for all of them),
    then a last block of the n mod c elements left; with fewer than `min_blocks` blocks the axis is
    one block, fn(0, n), and so it is on an accelerator (`on_accelerator`). The value is the
    whole-axis sum's up to float32 summation order.

    Args:
      fn: (start, size) -> an array, the same shape for every block: the partial sum over elements
        start .. start + size − 1 of the axis (start traced, size static).
      n: the length of the summed axis.
      c: elements per block; None: `SUM_BLOCK` (131072).
      min_blocks: the fewest full blocks worth splitting the axis into; None: `SUM_MIN_BLOCKS`.

    Returns:
      The sum of fn over the blocks.
    """
    if on_accelerator():
        return fn(0, n)
    c = max(int(SUM_BLOCK if c is None else c), 1)
    full, tail = divmod(n, c)
    if full < max(SUM_MIN_BLOCKS if min_blocks is None else min_blocks, 2):
        return fn(0, n)
    total = jnp.sum(jax.lax.map(lambda i: fn(i * c, c), jnp.arange(full, dtype=jnp.int32)), axis=0)
    return total + fn(full * c, tail) if tail else total


def block_starts(n: int, c: int) -> jax.Array:
    """Start offsets of the ceil(n / c) blocks of c ≤ n elements covering [0, n); the last one
    is moved back to n − c (overlapping its predecessor) so that every block is full."""
    return jnp.minimum(jnp.arange(-(-n // c), dtype=jnp.int32) * c, n - c)


def blockwise_map(fn, n: int, c: int, out_rows: int, like: Optional[jax.Array] = None) -> jax.Array:
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

"""MLPLOpt: a per-parameter MLP learned optimizer (Metz et al. 2019).

For each parameter tensor p with gradient g, accumulators (float32, shapes of p):

    m_k ← β_k m_k + (1 − β_k) g     for β in `decays` (default 0.1, 0.5, 0.9, 0.99, 0.999, 0.9999)
    v   ← β_v v + (1 − β_v) g²       (β_v = `rms_decay`)

Per-parameter features (F = len(decays) + 5):
    g, p, m_1..m_K, √v, g/√(v+ε), m_0.9/√(v+ε)
each divided by its root-mean-square over the tensor, and a step embedding shared by the
tensor: tanh(t/τ − 1) for τ in `timescales` (T values). The MLP maps [F + T] -> hidden ->
hidden -> (d, m) and the update is

    Δp = −d · exp(m · exp_mult) · step_mult.

Speed (CPU): the step embedding (and, with `use_num_steps`, the progress features) is
constant over a tensor, so its first-layer contribution is computed once per update and added
as a bias (the per-parameter matmul is F wide, not F + T). The per-tensor RMS normalisation is
folded into the first layer's rows, W1' = diag(1/rms) W1, so features are never rescaled.
Tensors of at least `column_min_size` parameters are processed in blocks of `chunk_size`
parameters (the last block overlaps the one before it, so every block is full; by default
`features.default_block_size()`: 32768 in a training loop's update; when the update runs batched
over many models, as meta-training's particles and the evaluation trainer's tasks do
(`features.batched_updates()`), 4096, and 1024 where the batch is sharded over one CPU device per
core, `features.sharded_updates()`): each block's [F, c] features are formed from slices of the
accumulators and the MLP runs on them column-major, h = relu(W1'ᵀ x + b), writing the block's
update in place. No [F, N] feature array or [H, N] activation ever exists (at 1M parameters the old padded [blocks, F, c] layout
page-faulted ~80 MB of fresh temporaries per update), everything per block stays in cache, and
XLA's CPU GEMM runs on a friendly shape. The RMS of each feature is a whole-tensor reduction,
taken block by block on big tensors (`features.blockwise_sum`) unless the update runs batched.
Under vmap over models (meta-training's particles, the evaluation trainer's tasks) every block
product stays one batched GEMM: the hidden and output weights are transposed once per update, and
copied per model when the models share theta (`vary_like`); XLA's CPU backend otherwise ran a
generic batched dot, or transposed the activations. Smaller tensors use a plain row-major MLP,
faster for them. Theta is unchanged by any of this, and `chunk_size` / `column_min_size` are not
part of `config()`: they change speed, not the function theta defines.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from lopt import features as ft
from lopt.base import LearnedOptimizer, speed_option
from lopt.moment_features import accumulate, feature_sum_squares, init_accumulators, leaf_features, momentum_index
from lopt.nn import per_param_mlp_init, shared_bias

DECAYS = (0.1, 0.5, 0.9, 0.99, 0.999, 0.9999)
COLUMN_MIN_SIZE = 256  # smaller tensors use the row-major MLP (faster there; measured crossover 100-300)


class MLPLOptState(NamedTuple):
    """MLPLOpt's optimizer state.

    Attributes:
      momenta: per leaf, float32 [K, *p.shape]: the momenta m_k (decay-major, so features stack
        without transposes).
      second_moment: per leaf, float32 [*p.shape]: v.
      iteration: int32 []: the number of updates so far.
    """
    momenta: Any
    second_moment: Any
    iteration: jax.Array


def vary_like(x: jax.Array, ref: jax.Array) -> jax.Array:
    """x, computed so that under vmap it varies over whatever batch `ref` varies over.

    A select between two copies of x on the predicate isnan(ref): its value is x for every value
    of ref (NaN and ±inf included), but JAX batches it like ref, so inside a vmap over models x
    becomes one copy per model. MLPLOpt uses it for the hidden and output weights when models
    share one theta (the evaluation trainer's tasks, the estimator benchmark's floor): a batched
    activation times unbatched weights made XLA's CPU backend transpose the activations around a
    plain GEMM, against one batched GEMM with per-model weights (problem (d)'s 16 tasks trained
    for 50 steps: 951 -> 757 ms). Outside vmap the select folds away.

    Args:
      x: any array.
      ref: a scalar the batch dimension is taken from.

    Returns:
      x's values, batched like ref.
    """
    return jnp.where(jnp.isnan(ref), x, x)


class MLPLOpt(LearnedOptimizer):
    """Per-parameter MLP over gradient/momentum/second-moment features and a step embedding.

    The features, the MLP and the step Δp = −d · exp(m · exp_mult) · step_mult are in the module
    docstring. Theta: {"input": {"w" [F, H], "w_time" [T, H], ("w_progress" [3, H],) "b" [H]},
    "hidden_i": {"w" [H, H], "b" [H]} for i in 1..hidden_layers-1, "output": {"w" [H, 2], "b" [2]}}.

    Args:
      hidden_size: H, the width of every hidden layer.
      hidden_layers: the number of hidden ReLU layers (≥ 1).
      decays: the momentum decays β_k (K of them; F = K + 5 features).
      rms_decay: β_v of the second moment v.
      step_mult: the step's scale.
      exp_mult: the magnitude output's scale inside exp.
      timescales: τ of the step embedding tanh(t/τ − 1).
      use_num_steps: also feed the progress features (min(t/N, 1), log1p(N)/10, 1), N the
        `num_steps` given to `opt_fn` (zeros when it is None).
      chunk_size: parameters per block of the column-major layout; None: `features.default_block_size()`
        when `opt_fn` is called: batched inside `features.batched_updates()`, per core inside
        `features.sharded_updates()` (speed only, not in `config()`).
      column_min_size: tensors smaller than this use the row-major MLP (speed only, not in `config()`).
    """

    hidden_size: int = 32
    hidden_layers: int = 2
    decays: tuple[float, ...] = DECAYS
    rms_decay: float = 0.999
    step_mult: float = 1e-3
    exp_mult: float = 1e-3
    timescales: tuple[float, ...] = ft.TIMESCALES
    use_num_steps: bool = False
    chunk_size: Optional[int] = speed_option(None)
    column_min_size: int = speed_option(COLUMN_MIN_SIZE)

    def check_config(self) -> None:
        if self.hidden_layers < 1 or self.hidden_size < 1:
            raise ValueError(f"MLPLOpt needs hidden_layers >= 1 and hidden_size >= 1, "
                             f"got {self.hidden_layers}, {self.hidden_size}")
        if self.chunk_size is not None and self.chunk_size < 1:
            raise ValueError(f"MLPLOpt needs chunk_size >= 1 (or None for the devices' default), got {self.chunk_size}")

    @property
    def _mom_idx(self) -> int:
        return momentum_index(self.decays)

    @property
    def block_size(self) -> int:
        """Parameters per block of an update built now by `opt_fn`: `chunk_size`, or
        `features.default_block_size()` (batched inside `features.batched_updates()`)."""
        return self.chunk_size or ft.default_block_size()

    @property
    def num_features(self) -> int:
        """F = K + 5, the number of per-parameter features."""
        return len(self.decays) + 5

    def init(self, key: jax.Array) -> dict:
        return per_param_mlp_init(key, self.num_features, len(self.timescales),
                                  ft.NUM_PROGRESS if self.use_num_steps else 0, self.hidden_size, self.hidden_layers)

    def opt_fn(self, theta: dict, *, num_steps: Optional[Any] = None,
               is_training: bool = False) -> optax.GradientTransformationExtraArgs:
        del is_training
        self.check_theta(theta, "MLPLOpt.opt_fn")
        decays = jnp.asarray(self.decays, jnp.float32)
        mom_idx = self._mom_idx
        block_size = self.block_size
        sum_blocks = not ft.updates_are_batched()  # per-tensor sums in blocks, unless vmapped (see features)

        def init_fn(params):
            return MLPLOptState(*init_accumulators(params, len(self.decays)), jnp.zeros((), jnp.int32))

        def later_layers_t(ref):
            """[(Wᵀ, b)] of the hidden layers after the first, then of the output layer, the
            transposes made once per update and each Wᵀ batched like `ref` (`vary_like`: one copy
            per model when the update is vmapped over models that share theta). The barrier keeps
            XLA from folding the transposes and copies back into the block's products: under vmap
            a dot with a transposed batched operand ran as XLA's generic batched dot rather than
            YNNPACK's GEMM (PES on problem (d), one device: 955 -> 799 ms per estimate)."""
            names = [f"hidden_{i}" for i in range(1, self.hidden_layers)] + ["output"]
            wts = [theta[name]["w"].T for name in names]
            if ref is not None:
                wts = [vary_like(wt, ref) for wt in wts]
            return [(wt, theta[name]["b"]) for wt, name in zip(jax.lax.optimization_barrier(wts), names)]

        def mlp_columns(w1t, b1, later, x):
            """x [F, c] -> [2, c], column-major (w1t = W1'ᵀ [H, F]; later from `later_layers_t`)."""
            h = jax.nn.relu(w1t @ x + b1[:, None])
            for wt, b in later[:-1]:
                h = jax.nn.relu(wt @ h + b[:, None])
            wt, b = later[-1]
            return wt @ h + b[:, None]

        def mlp_rows(w1, b1, x):
            """x [n, F] -> [n, 2], row-major (w1 = W1' [F, H])."""
            h = jax.nn.relu(x @ w1 + b1)
            for i in range(1, self.hidden_layers):
                layer = theta[f"hidden_{i}"]
                h = jax.nn.relu(h @ layer["w"] + layer["b"])
            return h @ theta["output"]["w"] + theta["output"]["b"]

        def to_step(out):
            """MLP output [2, c] (direction, magnitude) -> step [1, c] = d · exp(m · exp_mult) · step_mult."""
            return (out[0] * jnp.exp(out[1] * self.exp_mult) * self.step_mult)[None]

        def update_leaf(g, p, m, v, first_bias, later):
            if jnp.size(p) == 0:
                return jnp.zeros_like(p), m, v
            n, k = jnp.size(p), len(self.decays)
            g32, p32 = jnp.asarray(g, jnp.float32).reshape(-1), jnp.asarray(p, jnp.float32).reshape(-1)
            # in the tensor's own shape (see `accumulate`), then flat
            m, v = accumulate(jnp.asarray(g, jnp.float32), m, v, decays, self.rms_decay)
            m, v = m.reshape(k, n), v.reshape(-1)
            # (feats / rms) @ W1 == feats @ (W1 / rms[:, None]): per-tensor RMS normalisation folded into W1
            sum_sq = feature_sum_squares(g32, p32, m, v, mom_idx, sum_blocks)
            w1t = (theta["input"]["w"] * jax.lax.rsqrt(sum_sq / n + ft.EPS)[:, None]).T  # W1'ᵀ [H, F]
            if n < self.column_min_size:  # small tensors: row-major [n, F] @ [F, H] is cheaper
                out = mlp_rows(w1t.T, first_bias, jnp.stack(leaf_features(g32, p32, m, v, mom_idx), axis=-1))
                step = to_step(out.T)[0]
            else:
                c = min(block_size, n)

                def block(start):  # [F, c] features of elements start .. start + c - 1
                    sl = lambda x: jax.lax.dynamic_slice_in_dim(x, start, c, axis=x.ndim - 1)
                    feats = leaf_features(sl(g32), sl(p32), sl(m), sl(v), mom_idx)
                    # the barrier keeps XLA from fusing the feature arithmetic into the stack's
                    # concatenate, which its CPU backend emits as slow per-element code (4 vs 5.3 ms)
                    return jnp.stack(jax.lax.optimization_barrier(feats))

                step = ft.blockwise_map(lambda start: to_step(mlp_columns(w1t, first_bias, later, block(start))), n, c, 1,
                                        like=g32)[0]
            return ((-step).reshape(jnp.shape(p)).astype(jnp.result_type(p)), m.reshape((k,) + jnp.shape(p)),
                    v.reshape(jnp.shape(p)))

        def update_fn(updates, state, params=None, **extra_args):
            del extra_args
            ft.require_params(updates, params, "MLPLOpt")
            first_bias = shared_bias(theta["input"], state.iteration, self.timescales, num_steps)
            treedef, gs, (ps, ms, vs) = ft.leaves_of(updates, params, state.momenta, state.second_moment)
            # batched like the gradients: a gradient's first element
            later = later_layers_t(next((jnp.ravel(g)[0] for g in gs if jnp.size(g)), None))
            leaves = [update_leaf(g, p, m, v, first_bias, later) for g, p, m, v in zip(gs, ps, ms, vs)]
            new_updates, momenta, second = (treedef.unflatten(x) for x in zip(*leaves)) if leaves else (updates,) * 3
            return new_updates, MLPLOptState(momenta, second, state.iteration + 1)

        return optax.GradientTransformationExtraArgs(init_fn, update_fn)

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

How it is computed (the function is the one above; the layout changes speed and float32
rounding only). The step embedding (and, with `use_num_steps`, the progress features) is
constant over a tensor, so its first-layer contribution is computed once per update and added as
a bias (the per-parameter matmul is F wide, not F + T). The per-tensor RMS normalisation is
folded into the first layer's rows, W1' = diag(1/rms) W1, so features are never rescaled. A
tensor of n ≥ `column_min_size` parameters is processed in blocks of c = `chunk_size`
parameters, by default the `layout` option's `block_size(n)` (`lopt.parts.layout`: a function of
n alone, up to 32768 with the CPU layout, up to 2^22 with the accelerator layout); the last block overlaps
the one before it, so every block is full. Each block's [F, c] features are formed from slices
of the accumulators and the MLP runs on them column-major, h = relu(W1'ᵀ x + b), writing the
block's update in place: no [F, n] feature array or [H, n] activation exists. The sums of
squares behind the RMS are taken as the layout cuts them (`UpdateLayout.blockwise_sum`).
Smaller tensors use a row-major MLP on their [n, F] features.

Under `jax.vmap` over models every block product is one batched GEMM when each model has its own
theta, as the estimators' perturbed particles do. Models that share one theta (vmap `in_axes=None`)
multiply batched activations by unbatched weights, which XLA's CPU backend runs around transposes
of the activations: a caller that vmaps the update over many models should give each model its
own copy of theta (broadcast it and vmap over it, as `outer_trainers.make_task_trainer` does).
"""
from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from lopt.parts import features as ft
from lopt.base import LearnedOptimizer, layout_option, speed_option
from lopt.parts.moment_features import (MomentFeatures, accumulate, accumulator_fields, feature_names,
                                        feature_sum_squares, init_accumulators, leaf_features)
from lopt.parts.layout import blockwise_map
from lopt.parts.nn import per_param_mlp_init, shared_bias
from lopt.parts.spec import ArchSpec, iteration_field
from lopt.parts import tree_checks

DECAYS = (0.1, 0.5, 0.9, 0.99, 0.999, 0.9999)
COLUMN_MIN_SIZE = 256  # smaller tensors use the row-major MLP


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


class MLPLOpt(MomentFeatures, LearnedOptimizer):
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
      chunk_size: parameters per block of the column-major layout; None: the `layout`'s
        `block_size(n)` for a tensor of n parameters (speed only, not in `config()`).
      column_min_size: tensors smaller than this use the row-major MLP (speed only, not in `config()`).
      layout: the update layout, "cpu" or "accelerator" (`lopt.base.layout_option`; speed only).
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
    layout: Any = layout_option()

    def check_config(self) -> None:
        if self.hidden_layers < 1 or self.hidden_size < 1:
            raise ValueError(f"MLPLOpt needs hidden_layers >= 1 and hidden_size >= 1, "
                             f"got {self.hidden_layers}, {self.hidden_size}")
        if self.chunk_size is not None and self.chunk_size < 1:
            raise ValueError(f"MLPLOpt needs chunk_size >= 1 (or None for the devices' default), got {self.chunk_size}")

    def block_size(self, n: int) -> int:
        """The parameters per block of a tensor of n ≥ `column_min_size` parameters.

        Args:
          n: the tensor's number of parameters.

        Returns:
          min(`chunk_size`, n), or the layout's `block_size(n)` when `chunk_size` is None.
        """
        return min(self.chunk_size, n) if self.chunk_size else self.update_layout.block_size(n)

    def spec(self) -> ArchSpec:
        """Its features, constants and state layout (`lopt.parts.spec`; read by `lopt.torch` too).

        Returns:
          features `moment_features.feature_names(K)`; constants "eps" (`features.EPS`); state
          "momenta", "second_moment" (`moment_features.accumulator_fields`) and "iteration".
        """
        return ArchSpec("MLPLOpt", feature_names(len(self.decays)), {"eps": ft.EPS},
                        accumulator_fields(len(self.decays)) + (iteration_field(),))

    def init(self, key: jax.Array) -> dict:
        return per_param_mlp_init(key, self.num_features, len(self.timescales),
                                  ft.NUM_PROGRESS if self.use_num_steps else 0, self.hidden_size, self.hidden_layers)

    def opt_fn(self, theta: dict, *, num_steps: Optional[Any] = None,
               is_training: bool = False) -> optax.GradientTransformationExtraArgs:
        """The optimizer theta defines (the update is in the module docstring).

        Args:
          theta: meta-parameters, as from `init`.
          num_steps: the horizon N of the progress features (may be traced; read only with
            `use_num_steps`).
          is_training: accepted for the `LearnedOptimizer` interface and ignored: the update is the
            same while meta-training and after.

        Returns:
          An `optax.GradientTransformationExtraArgs`; its update reads `params` and ignores extra
          arguments such as `loss`.
        """
        del is_training
        self.check_theta(theta, "MLPLOpt.opt_fn")
        decays = jnp.asarray(self.decays, jnp.float32)
        mom_idx, layout = self.momentum_index, self.update_layout
        eps = self.spec().constants["eps"]

        def init_fn(params):
            return MLPLOptState(*init_accumulators(params, len(self.decays)), jnp.zeros((), jnp.int32))

        def later_layers_t():
            """[(Wᵀ, b)] of the hidden layers after the first, then of the output layer, the
            transposes made once per update. The optimization barrier keeps XLA from folding the
            transposes back into every block's products, where under vmap a dot with a transposed
            batched operand runs as XLA's CPU backend's generic batched dot instead of a GEMM."""
            names = [f"hidden_{i}" for i in range(1, self.hidden_layers)] + ["output"]
            wts = jax.lax.optimization_barrier([theta[name]["w"].T for name in names])
            return [(wt, theta[name]["b"]) for wt, name in zip(wts, names)]

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
            sum_sq = feature_sum_squares(g32, p32, m, v, mom_idx, layout)
            w1t = (theta["input"]["w"] * jax.lax.rsqrt(sum_sq / n + eps)[:, None]).T  # W1'ᵀ [H, F]
            if n < self.column_min_size:  # small tensors: row-major [n, F] @ [F, H] is cheaper
                out = mlp_rows(w1t.T, first_bias, jnp.stack(leaf_features(g32, p32, m, v, mom_idx), axis=-1))
                step = to_step(out.T)[0]
            else:
                c = self.block_size(n)

                def block(start):  # [F, c] features of elements start .. start + c - 1
                    sl = lambda x: jax.lax.dynamic_slice_in_dim(x, start, c, axis=x.ndim - 1)
                    feats = leaf_features(sl(g32), sl(p32), sl(m), sl(v), mom_idx)
                    # the barrier keeps XLA from fusing the feature arithmetic into the stack's
                    # concatenate, which its CPU backend emits as per-element code
                    return jnp.stack(jax.lax.optimization_barrier(feats))

                step = blockwise_map(lambda start: to_step(mlp_columns(w1t, first_bias, later, block(start))), n, c, 1,
                                     like=g32)[0]
            return ((-step).reshape(jnp.shape(p)).astype(jnp.result_type(p)), m.reshape((k,) + jnp.shape(p)),
                    v.reshape(jnp.shape(p)))

        def update_fn(updates, state, params=None, **extra_args):
            del extra_args
            tree_checks.require_params(updates, params, "MLPLOpt")
            first_bias = shared_bias(theta["input"], state.iteration, self.timescales, num_steps)
            treedef, gs, (ps, ms, vs) = tree_checks.leaves_of(updates, params, state.momenta, state.second_moment)
            later = later_layers_t()
            leaves = [update_leaf(g, p, m, v, first_bias, later) for g, p, m, v in zip(gs, ps, ms, vs)]
            new_updates, momenta, second = (treedef.unflatten(x) for x in zip(*leaves)) if leaves else (updates,) * 3
            return new_updates, MLPLOptState(momenta, second, state.iteration + 1)

        return optax.GradientTransformationExtraArgs(init_fn, update_fn)

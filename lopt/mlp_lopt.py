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
folded into the first layer's rows, W1' = diag(1/rms) W1, so the [N, F] features are written
once and never rescaled. The MLP runs over blocks of `chunk_size` parameters (`lax.map`), so
its [chunk, hidden] activations stay in cache instead of streaming N×hidden floats through
memory per layer (~3× faster at 1M parameters on a 2-core CPU). Theta is unchanged by these,
and `chunk_size` is not part of `config()`: it changes speed, not the function theta defines.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import optax

from lopt import features as ft
from lopt.adafac_mlp_lopt import first_layer_init, shared_bias
from lopt.base import LearnedOptimizer
from lopt.features import TIMESCALES, step_embedding  # noqa: F401  (re-exported)
from lopt.nn import dense_init

DECAYS = (0.1, 0.5, 0.9, 0.99, 0.999, 0.9999)
CHUNK = 16384


class MLPLOptState(NamedTuple):
    momenta: Any  # per leaf: float32 [*p.shape, K]
    second_moment: Any  # per leaf: float32 [*p.shape]
    iteration: jax.Array  # int32 []


def rms_normalize(x: jax.Array, axes: Sequence[int], eps: float = 1e-8) -> jax.Array:
    """x / sqrt(mean(x², axes) + eps): per-tensor second-moment normalisation."""
    return x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=tuple(axes), keepdims=True) + eps)


def chunked_apply(fn, x: jax.Array, chunk: int) -> jax.Array:
    """fn over the rows of x [N, F] in blocks of `chunk` rows (lax.map; the N % chunk rows
    left over go in one extra call). fn maps [n, F] -> [n, O]."""
    n = x.shape[0]
    main = (n // chunk) * chunk
    if main == 0:
        return fn(x)
    out = jax.lax.map(fn, x[:main].reshape(n // chunk, chunk, x.shape[1]))
    out = out.reshape(main, out.shape[-1])
    return out if main == n else jnp.concatenate([out, fn(x[main:])], axis=0)


class MLPLOpt(LearnedOptimizer):
    """Per-parameter MLP over gradient/momentum/second-moment features and a step embedding."""

    def __init__(self, hidden_size: int = 32, hidden_layers: int = 2, decays: Sequence[float] = DECAYS,
                 rms_decay: float = 0.999, step_mult: float = 1e-3, exp_mult: float = 1e-3,
                 timescales: Sequence[float] = TIMESCALES, use_num_steps: bool = False,
                 chunk_size: int = CHUNK):
        if hidden_layers < 1 or hidden_size < 1:
            raise ValueError(f"MLPLOpt needs hidden_layers >= 1 and hidden_size >= 1, got {hidden_layers}, {hidden_size}")
        self.hidden_size = int(hidden_size)
        self.hidden_layers = int(hidden_layers)
        self.decays = tuple(float(d) for d in decays)
        self.rms_decay = float(rms_decay)
        self.step_mult = float(step_mult)
        self.exp_mult = float(exp_mult)
        self.timescales = tuple(float(t) for t in timescales)
        self.use_num_steps = bool(use_num_steps)
        self.chunk_size = int(chunk_size)
        self._mom_idx = min(range(len(self.decays)), key=lambda i: abs(self.decays[i] - 0.9))

    @property
    def num_features(self) -> int:
        return len(self.decays) + 5

    def config(self) -> dict:
        return dict(hidden_size=self.hidden_size, hidden_layers=self.hidden_layers, decays=list(self.decays),
                    rms_decay=self.rms_decay, step_mult=self.step_mult, exp_mult=self.exp_mult,
                    timescales=list(self.timescales), use_num_steps=self.use_num_steps)

    def init(self, key: jax.Array) -> dict:
        keys = jax.random.split(key, self.hidden_layers + 2)
        h = self.hidden_size
        theta = {"input": first_layer_init(keys[0], self.num_features, len(self.timescales),
                                           ft.NUM_PROGRESS if self.use_num_steps else 0, h)}
        for i in range(1, self.hidden_layers):
            theta[f"hidden_{i}"] = dense_init(keys[i], h, h)
        theta["output"] = dense_init(keys[-1], h, 2)
        return theta

    def opt_fn(self, theta: dict, *, num_steps: Optional[Any] = None,
               is_training: bool = False) -> optax.GradientTransformationExtraArgs:
        del is_training
        decays = jnp.asarray(self.decays, jnp.float32)
        mom_idx, nfeat = self._mom_idx, self.num_features

        def init_fn(params):
            zeros = lambda p, *extra: jnp.zeros(jnp.shape(p) + extra, jnp.float32)
            return MLPLOptState(
                momenta=jax.tree_util.tree_map(lambda p: zeros(p, len(self.decays)), params),
                second_moment=jax.tree_util.tree_map(zeros, params),
                iteration=jnp.zeros((), jnp.int32),
            )

        def mlp(w1, b1, x):
            x = jax.nn.relu(x @ w1 + b1)
            for i in range(1, self.hidden_layers):
                layer = theta[f"hidden_{i}"]
                x = jax.nn.relu(x @ layer["w"] + layer["b"])
            return x @ theta["output"]["w"] + theta["output"]["b"]

        def update_leaf(g, p, m, v, first_bias):
            if jnp.size(p) == 0:
                return jnp.zeros_like(p), m, v
            g32, p32 = g.astype(jnp.float32).reshape(-1), p.astype(jnp.float32).reshape(-1)
            m = decays * m.reshape(-1, len(self.decays)) + (1.0 - decays) * g32[:, None]
            v = self.rms_decay * v.reshape(-1) + (1.0 - self.rms_decay) * jnp.square(g32)
            rsqrt_v = jax.lax.rsqrt(v + 1e-8)
            feats = jnp.concatenate(
                [g32[:, None], p32[:, None], m,
                 jnp.stack([jnp.sqrt(v), g32 * rsqrt_v, m[:, mom_idx] * rsqrt_v], axis=-1)], axis=-1)  # [N, F]
            assert feats.shape[-1] == nfeat
            # rms_normalize(feats) @ W1 == feats @ (W1 / rms[:, None])
            w1 = theta["input"]["w"] * jax.lax.rsqrt(jnp.mean(jnp.square(feats), axis=0) + 1e-8)[:, None]
            out = chunked_apply(lambda x: mlp(w1, first_bias, x), feats, self.chunk_size)
            step = out[:, 0] * jnp.exp(out[:, 1] * self.exp_mult) * self.step_mult
            return ((-step).reshape(jnp.shape(p)).astype(p.dtype), m.reshape(jnp.shape(p) + (len(self.decays),)),
                    v.reshape(jnp.shape(p)))

        def update_fn(updates, state, params=None, **extra_args):
            del extra_args
            if params is None:
                raise ValueError("MLPLOpt needs params: call tx.update(grads, state, params)")
            first_bias = shared_bias(theta["input"], state.iteration, self.timescales, num_steps)
            treedef, gs, (ps, ms, vs) = ft.leaves_of(updates, params, state.momenta, state.second_moment)
            leaves = [update_leaf(g, p, m, v, first_bias) for g, p, m, v in zip(gs, ps, ms, vs)]
            new_updates, momenta, second = (treedef.unflatten(x) for x in zip(*leaves)) if leaves else (updates,) * 3
            return new_updates, MLPLOptState(momenta, second, state.iteration + 1)

        return optax.GradientTransformationExtraArgs(init_fn, update_fn)

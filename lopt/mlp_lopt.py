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

The step embedding is constant over a tensor, so its first-layer contribution is computed
once per update and added as a bias (the per-parameter matmul is F wide, not F + T).
"""
from __future__ import annotations

from typing import Any, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import optax

from lopt.base import LearnedOptimizer

DECAYS = (0.1, 0.5, 0.9, 0.99, 0.999, 0.9999)
TIMESCALES = (1, 3, 10, 30, 100, 300, 1000, 3000, 10000, 30000, 100000)


class MLPLOptState(NamedTuple):
    momenta: Any  # per leaf: float32 [*p.shape, K]
    second_moment: Any  # per leaf: float32 [*p.shape]
    iteration: jax.Array  # int32 []


def rms_normalize(x: jax.Array, axes: Sequence[int], eps: float = 1e-8) -> jax.Array:
    """x / sqrt(mean(x², axes) + eps): per-tensor second-moment normalisation."""
    return x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=tuple(axes), keepdims=True) + eps)


def step_embedding(iteration: jax.Array, timescales: Sequence[float]) -> jax.Array:
    """tanh(t/τ − 1) for each τ: [T] float32."""
    t = jnp.asarray(iteration, jnp.float32)
    return jnp.tanh(t / jnp.asarray(timescales, jnp.float32) - 1.0)


def _dense_init(key: jax.Array, fan_in: int, fan_out: int) -> dict:
    w = jax.random.normal(key, (fan_in, fan_out), jnp.float32) / jnp.sqrt(fan_in)
    return {"w": w, "b": jnp.zeros((fan_out,), jnp.float32)}


class MLPLOpt(LearnedOptimizer):
    """Per-parameter MLP over gradient/momentum/second-moment features and a step embedding."""

    def __init__(self, hidden_size: int = 32, hidden_layers: int = 2, decays: Sequence[float] = DECAYS,
                 rms_decay: float = 0.999, step_mult: float = 1e-3, exp_mult: float = 1e-3,
                 timescales: Sequence[float] = TIMESCALES):
        if hidden_layers < 1 or hidden_size < 1:
            raise ValueError(f"MLPLOpt needs hidden_layers >= 1 and hidden_size >= 1, got {hidden_layers}, {hidden_size}")
        self.hidden_size = int(hidden_size)
        self.hidden_layers = int(hidden_layers)
        self.decays = tuple(float(d) for d in decays)
        self.rms_decay = float(rms_decay)
        self.step_mult = float(step_mult)
        self.exp_mult = float(exp_mult)
        self.timescales = tuple(float(t) for t in timescales)
        self._mom_idx = min(range(len(self.decays)), key=lambda i: abs(self.decays[i] - 0.9))

    @property
    def num_features(self) -> int:
        return len(self.decays) + 5

    def config(self) -> dict:
        return dict(hidden_size=self.hidden_size, hidden_layers=self.hidden_layers, decays=list(self.decays),
                    rms_decay=self.rms_decay, step_mult=self.step_mult, exp_mult=self.exp_mult,
                    timescales=list(self.timescales))

    def init(self, key: jax.Array) -> dict:
        keys = jax.random.split(key, self.hidden_layers + 2)
        f, t, h = self.num_features, len(self.timescales), self.hidden_size
        first = _dense_init(keys[0], f + t, h)
        theta = {"input": {"w": first["w"][:f], "w_time": first["w"][f:], "b": first["b"]}}
        for i in range(1, self.hidden_layers):
            theta[f"hidden_{i}"] = _dense_init(keys[i], h, h)
        theta["output"] = _dense_init(keys[-1], h, 2)
        return theta

    def opt_fn(self, theta: dict, *, num_steps: Optional[Any] = None,
               is_training: bool = False) -> optax.GradientTransformationExtraArgs:
        del num_steps, is_training
        decays = jnp.asarray(self.decays, jnp.float32)
        mom_idx, nfeat = self._mom_idx, self.num_features

        def init_fn(params):
            zeros = lambda p, *extra: jnp.zeros(jnp.shape(p) + extra, jnp.float32)
            return MLPLOptState(
                momenta=jax.tree_util.tree_map(lambda p: zeros(p, len(self.decays)), params),
                second_moment=jax.tree_util.tree_map(zeros, params),
                iteration=jnp.zeros((), jnp.int32),
            )

        def mlp(feats, first_bias):
            x = jax.nn.relu(feats @ theta["input"]["w"] + first_bias)
            for i in range(1, self.hidden_layers):
                layer = theta[f"hidden_{i}"]
                x = jax.nn.relu(x @ layer["w"] + layer["b"])
            out = x @ theta["output"]["w"] + theta["output"]["b"]
            return out[..., 0], out[..., 1]

        def update_leaf(g, p, m, v, first_bias):
            if jnp.size(p) == 0:
                return jnp.zeros_like(p), m, v
            g32, p32 = g.astype(jnp.float32), p.astype(jnp.float32)
            m = decays * m + (1.0 - decays) * g32[..., None]
            v = self.rms_decay * v + (1.0 - self.rms_decay) * jnp.square(g32)
            rsqrt_v = jax.lax.rsqrt(v + 1e-8)
            feats = jnp.concatenate(
                [g32[..., None], p32[..., None], m,
                 jnp.stack([jnp.sqrt(v), g32 * rsqrt_v, m[..., mom_idx] * rsqrt_v], axis=-1)], axis=-1)
            feats = rms_normalize(feats, range(feats.ndim - 1))
            assert feats.shape[-1] == nfeat
            d, mag = mlp(feats, first_bias)
            step = d * jnp.exp(mag * self.exp_mult) * self.step_mult
            return (-step).astype(p.dtype), m, v

        def update_fn(updates, state, params=None, **extra_args):
            del extra_args
            if params is None:
                raise ValueError("MLPLOpt needs params: call tx.update(grads, state, params)")
            emb = step_embedding(state.iteration, self.timescales)
            first_bias = theta["input"]["b"] + emb @ theta["input"]["w_time"]
            treedef = jax.tree_util.tree_structure(updates)
            leaves = [update_leaf(g, p, m, v, first_bias) for g, p, m, v in zip(
                treedef.flatten_up_to(updates), treedef.flatten_up_to(params),
                treedef.flatten_up_to(state.momenta), treedef.flatten_up_to(state.second_moment))]
            new_updates, momenta, second = (treedef.unflatten(x) for x in zip(*leaves)) if leaves else (updates,) * 3
            return new_updates, MLPLOptState(momenta, second, state.iteration + 1)

        return optax.GradientTransformationExtraArgs(init_fn, update_fn)

"""Quadratic inner problems: cheap, data-free, with exact gradients.

Task loss (x ∈ R^dim, curvature h > 0, centre c, optional gradient noise z ~ N(0, I) from key):

    L(x) = 0.5 · mean_i h_i (x_i − c_i)²  +  noise_std · mean_i z_i x_i

The noise term has zero mean, so E[∇L] is the noiseless gradient. With x ~ N(0, s²I) at
init, E[L] = 0.5 · mean_i h_i (s² + c_i²); with `normalize=True` the normaliser divides by it
(an untrained task scores ~1). The default keeps the identity normaliser (meta-loss = raw loss).
Batched-data quadratics (least squares on a DataSource) live in `tasks.regression`.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from tasks.base import Task, TaskFamily, scaled_normalizer


class QuadraticTask(Task):
    """One quadratic L(x) = 0.5 · mean_i h_i (x_i − c_i)² (+ gradient noise) over params {"x": [dim]}
    (see the module docstring); no data.

    Args:
      curvature: h, [dim], positive (may be traced).
      center: c, [dim] (may be traced).
      init_scale: s, the std of x ~ N(0, s²I) at init.
      noise_std: the scale of the zero-mean noise term noise_std · mean_i z_i x_i (0: exact gradients).
      normalize: divide the loss by its expected value at init in the normaliser (clipped at 10);
        else the normaliser is the identity.
      name: the task's name.
    """

    def __init__(self, curvature: Any, center: Any, *, init_scale: float = 1.0, noise_std: float = 0.0,
                 normalize: bool = False, name: str = "quadratic"):
        self.curvature = jnp.asarray(curvature, jnp.float32)
        self.center = jnp.asarray(center, jnp.float32)
        if self.curvature.ndim != 1 or self.curvature.shape != self.center.shape:
            raise ValueError(f"curvature and center must both be [dim], got {self.curvature.shape} "
                             f"and {self.center.shape}")
        self.dim = int(self.curvature.shape[0])
        self.init_scale = init_scale
        self.noise_std = float(noise_std)
        self.name = name
        if normalize:
            expected_init_loss = 0.5 * jnp.mean(self.curvature * (init_scale ** 2 + jnp.square(self.center)))
            self.normalizer = scaled_normalizer(jnp.maximum(expected_init_loss, 1e-8))

    def init(self, key: jax.Array) -> dict:
        return {"x": self.init_scale * jax.random.normal(key, (self.dim,), jnp.float32)}

    def loss(self, params: dict, key: jax.Array, batch: Any = None) -> jax.Array:
        del batch
        x = params["x"]
        if x.shape != (self.dim,):
            raise ValueError(f"{self.name}: params['x'] must have shape ({self.dim},), got {x.shape}")
        loss = 0.5 * jnp.mean(self.curvature * jnp.square(x - self.center))
        if self.noise_std > 0:
            z = jax.random.normal(key, x.shape, x.dtype)
            loss = loss + self.noise_std * jnp.mean(z * x)
        return loss


class QuadraticFamily(TaskFamily):
    """Quadratics with per-task curvature log-uniform in [min_curvature, max_curvature] and centre
    N(0, I): `sample(key)` -> {"curvature": float32 [dim], "center": float32 [dim]}.

    Args:
      dim: the number of parameters.
      min_curvature: the lower end of the curvature range (> 0).
      max_curvature: the upper end of the curvature range.
      noise_std: each task's gradient-noise scale (see QuadraticTask).
      init_scale: each task's init std.
      normalize: each task's normaliser divides by its expected initial loss (see QuadraticTask).
    """

    def __init__(self, dim: int = 10, *, min_curvature: float = 0.1, max_curvature: float = 10.0,
                 noise_std: float = 0.0, init_scale: float = 1.0, normalize: bool = False):
        if dim < 1:
            raise ValueError(f"QuadraticFamily dim must be >= 1, got {dim}")
        if not 0 < min_curvature <= max_curvature:
            raise ValueError(f"need 0 < min_curvature <= max_curvature, got {min_curvature}, {max_curvature}")
        self.dim = int(dim)
        self.min_curvature = float(min_curvature)
        self.max_curvature = float(max_curvature)
        self.noise_std = float(noise_std)
        self.init_scale = float(init_scale)
        self.normalize = bool(normalize)
        self.name = f"quadratic_dim{dim}"
        self.data = None

    def sample(self, key: jax.Array) -> dict:
        k1, k2 = jax.random.split(key)
        log_h = jax.random.uniform(k1, (self.dim,), jnp.float32,
                                   jnp.log(self.min_curvature), jnp.log(self.max_curvature))
        return {"curvature": jnp.exp(log_h), "center": jax.random.normal(k2, (self.dim,), jnp.float32)}

    def task_fn(self, cfg: dict) -> QuadraticTask:
        return QuadraticTask(cfg["curvature"], cfg["center"], init_scale=self.init_scale,
                             noise_std=self.noise_std, normalize=self.normalize, name=self.name)

"""Batched-data quadratics: linear least squares on a shared design DataSource.

Features x ∈ R^dim come from a fixed Gaussian with covariance Σ = Q diag(λ) Qᵀ, eigenvalues λ
log-uniform in [1/condition, 1] rescaled to mean 1 (so tr Σ = dim). Per task: a target
w* ~ N(0, I/dim) and label-noise std σ. With a batch X [B, dim] and z ~ N(0, I) from the key,

    y = X w* + σ z,        L(w) = 0.5 · mean_b (x_b·w − y_b)²,

so E[L] = 0.5 (w − w*)ᵀ Σ (w − w*) + 0.5 σ²: a quadratic whose gradients are noisy through the
minibatch. At init w ~ N(0, s²I/dim), E[L] ≈ 0.5 (1 + s² + σ²): the normaliser's scale.
"""
from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from tasks.base import Task, TaskFamily, check_count, check_range, log_uniform, scaled_normalizer
from tasks.datasets.data_source import DataSource, from_arrays


def regression_features(dim: int, num_examples: int = 2048, batch_size: int = 64, *, condition: float = 10.0,
                        seed: int = 0) -> DataSource:
    """The shared design of the least-squares tasks: {"x": float32 [B, dim]} drawn from N(0, Σ).

    Args:
      dim: the number of features.
      num_examples: the number of rows drawn (split into train / valid / test).
      batch_size: examples per batch.
      condition: the condition number of Σ (its eigenvalues span [1/condition, 1] before rescaling).
      seed: the seed of the numpy draw and of the splits.

    Returns:
      A DataSource named "regression_dim{dim}".
    """
    rng = np.random.default_rng(seed)
    lam = np.exp(rng.uniform(-np.log(condition), 0.0, dim))
    lam = lam / lam.mean()
    q, _ = np.linalg.qr(rng.normal(size=(dim, dim)))
    x = rng.normal(size=(num_examples, dim)) * np.sqrt(lam) @ q.T
    return from_arrays({"x": x.astype(np.float32)}, batch_size, seed=seed, name=f"regression_dim{dim}")


class LinearRegressionTask(Task):
    """Least squares L(w) = 0.5 · mean_b (x_b·w − y_b)², y = X w* + σ z, over params {"w": [dim]}
    (see the module docstring); normaliser loss / (0.5 (1 + s² + σ²)), clipped at 10.

    Args:
      data: a DataSource of {"x": [B, dim]} (e.g. `regression_features`).
      w_star: w*, the target weights [dim] (may be traced).
      noise_std: σ, the label-noise std (may be traced).
      init_scale: s: w ~ N(0, s²I/dim) at init (may be traced).
      name: the task's name (default: from dim).
    """

    def __init__(self, data: DataSource, w_star: Any, noise_std: Any = 0.1, *, init_scale: Any = 1.0,
                 name: Optional[str] = None):
        spec = data.element_spec("train")
        if "x" not in spec or len(spec["x"].shape) != 2:
            raise ValueError(f"LinearRegressionTask needs a DataSource with 'x' [B, dim], got {spec}")
        self.dim = int(spec["x"].shape[1])
        self.w_star = jnp.asarray(w_star, jnp.float32)
        if self.w_star.shape != (self.dim,):
            raise ValueError(f"w_star must have shape ({self.dim},), got {self.w_star.shape}")
        self.data, self.noise_std, self.init_scale = data, noise_std, init_scale
        self.name = name or f"linear_regression_dim{self.dim}"
        self.normalizer = scaled_normalizer(0.5 * (1.0 + init_scale ** 2 + noise_std ** 2))

    def init(self, key: jax.Array) -> dict:
        return {"w": self.init_scale / jnp.sqrt(self.dim) * jax.random.normal(key, (self.dim,), jnp.float32)}

    def loss(self, params: dict, key: jax.Array, batch: dict) -> jax.Array:
        x = batch["x"]
        y = x @ self.w_star + self.noise_std * jax.random.normal(key, x.shape[:1], x.dtype)
        return 0.5 * jnp.mean(jnp.square(x @ params["w"] - y))

    def trivial_loss(self, split: str = "test") -> Any:
        """The expected loss of predicting the mean target (an input-independent prediction).

        With ȳ = mean_{i ∈ train} x_i·w* (the train split's mean target; the label noise has mean 0),
        scored over every example of `split` in expectation over the label noise (which `loss`
        draws afresh per batch): 0.5 · mean_{i ∈ split} (x_i·w* − ȳ)² + 0.5 σ².

        Args:
          split: the split scored: "test" (default; where the suites measure the held-out loss)
            or "train" (to compare with final train losses).

        Returns:
          a float; a jax scalar when w* or σ is traced (a task built from a traced cfg).
        """
        y_bar = jnp.mean(self.data.splits["train"]["x"] @ self.w_star)
        residual = self.data.splits[split]["x"] @ self.w_star - y_bar
        value = 0.5 * jnp.mean(jnp.square(residual)) + 0.5 * jnp.square(jnp.asarray(self.noise_std, jnp.float32))
        return value if isinstance(value, jax.core.Tracer) else float(value)


class LinearRegressionFamily(TaskFamily):
    """Least-squares tasks sharing one design (`regression_features`); per task w* ~ N(0, I/dim)
    and σ log-uniform in `noise_range`: `sample(key)` -> {"w_star": float32 [dim], "noise_std": float32 []}.

    Args:
      dim: the number of features and parameters.
      batch_size: examples per batch.
      num_examples: the size of the shared design.
      condition: the condition number of the features' covariance Σ.
      noise_range: (lo, hi), 0 < lo ≤ hi, of the label-noise std σ.
      init_scale: each task's init scale s.
      seed: the seed of the design (and of its splits).
    """

    def __init__(self, dim: int = 10, *, batch_size: int = 64, num_examples: int = 2048, condition: float = 10.0,
                 noise_range: tuple[float, float] = (0.01, 0.5), init_scale: float = 1.0, seed: int = 0):
        self.dim, self.init_scale = int(dim), float(init_scale)
        self.noise_range = check_range(noise_range, "noise_range")
        check_count(batch_size, "LinearRegressionFamily: batch_size")
        self.data = regression_features(dim, num_examples, batch_size, condition=condition, seed=seed)
        self.name = f"linear_regression_family_dim{dim}"

    def sample(self, key: jax.Array) -> dict:
        k1, k2 = jax.random.split(key)
        lo, hi = self.noise_range
        return {"w_star": jax.random.normal(k1, (self.dim,), jnp.float32) / jnp.sqrt(self.dim),
                "noise_std": log_uniform(k2, lo, hi)}

    def task_fn(self, cfg: dict) -> LinearRegressionTask:
        return LinearRegressionTask(self.data, cfg["w_star"], cfg["noise_std"], init_scale=self.init_scale,
                                    name=self.name)

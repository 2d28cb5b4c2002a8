"""Task augmentation: TaskFamily -> TaskFamily wrappers that widen a task distribution.

    ScaleReparam(f, (lo, hi))        params p = c ⊙ p',  the optimizer trains p'; one log-uniform
                                      c per parameter tensor per task: ∇_{p'} = c ⊙ ∇_p
    ReducedBatchSize(f, n)           the same tasks on minibatches of n (noisier gradients)
    GradientNoise(f, (lo, hi))       ∇ ← ∇ + σ z, z ~ N(0, I), σ log-uniform per task; the loss
                                      value is unchanged
    NormalizeByInitialLoss(f)        L ← L / L₀ with L₀ the task's first training loss (kept in
                                      model_state), so every task starts at ~1

Each wrapper's cfg is {"inner": inner_cfg, ...its own per-task values}; they compose. Wrapping
a family reads no data: a wrapper's `data` is its inner family's, loaded on first use.
"""
from __future__ import annotations

import functools
from typing import Optional

import jax
import jax.numpy as jnp

from tasks.base import Task, TaskFamily, check_range, log_uniform, scaled_normalizer
from tasks.nets import ImageClassifierFamily


class WrappedTask(Task):
    """A Task that delegates everything to `inner` (data, normaliser, init, loss); the
    augmentations' tasks subclass it and override what they change.

    Args:
      inner: the wrapped Task.
      suffix: appended to the inner task's name: "{inner.name}_{suffix}".
    """

    def __init__(self, inner: Task, suffix: str):
        self.inner = inner
        self.data = inner.data
        self.name = f"{inner.name}_{suffix}"
        self.normalizer = inner.normalizer

    def init_with_state(self, key):
        return self.inner.init_with_state(key)

    def loss_with_state(self, params, model_state, key, batch):
        return self.inner.loss_with_state(params, model_state, key, batch)


class _WrappedFamily(TaskFamily):
    def __init__(self, family: TaskFamily, suffix: str):
        if not isinstance(family, TaskFamily):
            raise TypeError(f"expected a tasks.TaskFamily, got {type(family).__name__}")
        self.family = family
        self.name = f"{family.name}_{suffix}"

    @property
    def data(self):
        """The inner family's data (loaded on first use, not when the family is wrapped)."""
        return self.family.data


def _static_batch_size(family: TaskFamily) -> Optional[int]:
    """The batch size of `family.data`, read without loading the data where the family states it
    (image-classifier families and these wrappers); None for a family without data."""
    if isinstance(family, ReducedBatchSize):
        return family.batch_size
    if isinstance(family, _WrappedFamily):
        return _static_batch_size(family.family)
    if isinstance(family, ImageClassifierFamily):
        return family.batch_size
    return None if family.data is None else int(family.data.batch_size)


class _ScaledTask(WrappedTask):
    def __init__(self, inner, scales):
        super().__init__(inner, "reparam")
        self.scales = scales

    def init_with_state(self, key):
        params, state = self.inner.init_with_state(key)
        return jax.tree_util.tree_map(lambda p, c: p / c, params, self.scales), state

    def loss_with_state(self, params, model_state, key, batch):
        real = jax.tree_util.tree_map(lambda p, c: p * c, params, self.scales)
        return self.inner.loss_with_state(real, model_state, key, batch)


class ScaleReparam(_WrappedFamily):
    """Per-tensor parameter rescaling p = c·p' (the optimizer trains p'), c log-uniform in
    `scale_range` per tensor and task: `sample(key)` -> {"inner": inner cfg, "scales": a float32 []
    per parameter tensor, in the params' tree structure}.

    Args:
      family: the TaskFamily to augment.
      scale_range: (lo, hi), 0 < lo ≤ hi, of the scales c.
    """

    def __init__(self, family: TaskFamily, scale_range: tuple[float, float] = (0.1, 10.0)):
        super().__init__(family, "reparam")
        self.scale_range = check_range(scale_range, "scale_range")

    @functools.cached_property
    def _treedef(self):
        # The params' structure: shapes only, but task_fn needs the inner family's data (on first use).
        family = self.family
        return jax.tree_util.tree_structure(jax.eval_shape(
            lambda k: family.task_fn(family.sample(k)).init_with_state(k)[0], jax.random.key(0)))

    def sample(self, key):
        k_inner, k_scale = jax.random.split(key)
        n = self._treedef.num_leaves
        scales = log_uniform(k_scale, *self.scale_range, (n,))
        return {"inner": self.family.sample(k_inner),
                "scales": jax.tree_util.tree_unflatten(self._treedef, [scales[i] for i in range(n)])}

    def task_fn(self, cfg):
        return _ScaledTask(self.family.task_fn(cfg["inner"]), cfg["scales"])


class _RebatchedTask(WrappedTask):
    def __init__(self, inner, data):
        super().__init__(inner, f"bs{data.batch_size}")
        self.data = data


class ReducedBatchSize(_WrappedFamily):
    """The inner family on minibatches of `batch_size` (static: a different batch shape
    compiles once). `sample` is the inner family's.

    Args:
      family: the TaskFamily to augment (it must have data).
      batch_size: the new batch size, in [1, the family's batch size].
    """

    def __init__(self, family: TaskFamily, batch_size: int):
        inner = _static_batch_size(family)
        if inner is None:
            raise ValueError(f"ReducedBatchSize needs a family with data; {family.name} has none")
        if not 0 < int(batch_size) <= inner:
            raise ValueError(f"batch_size must be in [1, {inner}], got {batch_size}")
        super().__init__(family, f"bs{int(batch_size)}")
        self.batch_size = int(batch_size)

    @functools.cached_property
    def data(self):
        """The inner family's data with this batch size (the same arrays; loaded on first use)."""
        return self.family.data.with_batch_size(self.batch_size)

    def sample(self, key):
        return self.family.sample(key)

    def task_fn(self, cfg):
        return _RebatchedTask(self.family.task_fn(cfg), self.data)


class _NoisyGradTask(WrappedTask):
    def __init__(self, inner, std):
        super().__init__(inner, "gradnoise")
        self.std = std

    def loss_with_state(self, params, model_state, key, batch):
        k_inner, k_noise = jax.random.split(key)
        loss, model_state = self.inner.loss_with_state(params, model_state, k_inner, batch)
        leaves = jax.tree_util.tree_leaves(params)
        keys = jax.random.split(k_noise, len(leaves))
        # d/dp of sum(σ z·p) is σ z; subtracting its stop-gradient keeps the loss value exact.
        noise = sum(jnp.sum(self.std * jax.random.normal(k, p.shape, p.dtype) * p) for k, p in zip(keys, leaves))
        return loss + noise - jax.lax.stop_gradient(noise), model_state


class GradientNoise(_WrappedFamily):
    """Adds N(0, σ²) noise to every gradient entry (the loss value is unchanged), σ log-uniform
    in `std_range` per task: `sample(key)` -> {"inner": inner cfg, "grad_noise_std": float32 []}.

    Args:
      family: the TaskFamily to augment.
      std_range: (lo, hi), 0 < lo ≤ hi, of σ.
    """

    def __init__(self, family: TaskFamily, std_range: tuple[float, float] = (0.01, 1.0)):
        super().__init__(family, "gradnoise")
        self.std_range = check_range(std_range, "std_range")

    def sample(self, key):
        k_inner, k_std = jax.random.split(key)
        return {"inner": self.family.sample(k_inner), "grad_noise_std": log_uniform(k_std, *self.std_range)}

    def task_fn(self, cfg):
        return _NoisyGradTask(self.family.task_fn(cfg["inner"]), cfg["grad_noise_std"])


class _InitLossNormalizedTask(WrappedTask):
    def __init__(self, inner, max_value):
        super().__init__(inner, "initnorm")
        self.normalizer = scaled_normalizer(1.0, max_value)

    def init_with_state(self, key):
        params, state = self.inner.init_with_state(key)
        return params, {"inner": state, "initial_loss": jnp.full((), jnp.nan, jnp.float32)}

    def loss_with_state(self, params, model_state, key, batch):
        loss, inner_state = self.inner.loss_with_state(params, model_state["inner"], key, batch)
        l0 = model_state["initial_loss"]
        l0 = jnp.where(jnp.isnan(l0), jax.lax.stop_gradient(loss).astype(jnp.float32), l0)
        scale = jnp.maximum(jnp.abs(l0), 1e-8)
        return loss / scale, {"inner": inner_state, "initial_loss": l0}


class NormalizeByInitialLoss(_WrappedFamily):
    """Divides each task's loss by its first training loss L₀ (recorded in model_state on the first
    `loss_with_state` call), so gradients and meta-losses share one scale; the normaliser then
    only clips at `max_value`. Use through `init_with_state` / `loss_with_state`. `sample` is the
    inner family's.

    Args:
      family: the TaskFamily to augment.
      max_value: the normaliser's clip (and its value for non-finite losses).
    """

    def __init__(self, family: TaskFamily, max_value: float = 10.0):
        super().__init__(family, "initnorm")
        self.max_value = float(max_value)

    def sample(self, key):
        return self.family.sample(key)

    def task_fn(self, cfg):
        return _InitLossNormalizedTask(self.family.task_fn(cfg), self.max_value)

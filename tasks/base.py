"""Task and TaskFamily: the inner problems a learned optimizer trains.

A `Task` is a differentiable loss over a parameter pytree:

    params = task.init(key)
    loss = task.loss(params, key, batch)        # batch = task.data.batch(key, "train")

A `TaskFamily` is a distribution over tasks that share one parameter structure:

    cfg = family.sample(key)                    # a jittable pytree: families vmap over cfgs
    task = family.task_fn(cfg)                  # may be called inside jit / vmap with traced cfg

All tasks of a family share `family.data` (a `DataSource` pytree or None), so the data
arrays can be passed into jit once as an argument instead of being baked in as constants.
"""
from __future__ import annotations

from typing import Any, Callable

import math

import jax
import jax.numpy as jnp

Params = Any
ModelState = Any
Batch = Any


class Task:
    """One inner problem. Subclasses implement `init` and `loss` (or the `_with_state` pair)."""

    name: str = "task"
    data: Any = None  # a DataSource or None (e.g. quadratics need no data)

    def init(self, key: jax.Array) -> Params:
        return self.init_with_state(key)[0]

    def init_with_state(self, key: jax.Array) -> tuple[Params, ModelState]:
        if type(self).init is Task.init:
            raise NotImplementedError(f"{type(self).__name__} must implement init or init_with_state")
        return self.init(key), {}

    def loss(self, params: Params, key: jax.Array, batch: Batch) -> jax.Array:
        raise NotImplementedError(
            f"{type(self).__name__} does not implement loss; stateful tasks are used through loss_with_state"
        )

    def loss_with_state(
        self, params: Params, model_state: ModelState, key: jax.Array, batch: Batch
    ) -> tuple[jax.Array, ModelState]:
        if type(self).loss is Task.loss:
            raise NotImplementedError(f"{type(self).__name__} must implement loss or loss_with_state")
        return self.loss(params, key, batch), model_state

    def normalizer(self, loss: jax.Array) -> jax.Array:
        """Maps this task's loss to a scale comparable across tasks (meta-losses use it)."""
        return loss

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


class TaskFamily:
    """A distribution over tasks with one parameter structure.

    `sample(key)` must be jittable and return a pytree of arrays; `task_fn(cfg)` builds a
    Task from a (possibly traced) cfg.
    """

    name: str = "task_family"
    data: Any = None

    def sample(self, key: jax.Array) -> Any:
        raise NotImplementedError

    def task_fn(self, cfg: Any) -> Task:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


class _SingleTaskFamily(TaskFamily):
    def __init__(self, task: Task):
        self.task = task
        self.name = task.name
        self.data = task.data

    def sample(self, key: jax.Array) -> jax.Array:
        del key
        return jnp.zeros((), jnp.int32)

    def task_fn(self, cfg: Any) -> Task:
        del cfg
        return self.task


def single_task_family(task: Task) -> TaskFamily:
    """Lifts one Task to a TaskFamily whose every sample is that task."""
    if not isinstance(task, Task):
        raise TypeError(f"single_task_family expects a tasks.Task, got {type(task).__name__}")
    return _SingleTaskFamily(task)


def classification_normalizer(num_classes: int, max_value: float = 1.5) -> Callable[[jax.Array], jax.Array]:
    """loss / log(num_classes), clipped to `max_value`: an untrained classifier scores ~1.
    Non-finite losses map to `max_value` so a diverged inner run yields a bounded meta-loss."""
    return scaled_normalizer(math.log(num_classes), max_value)


def scaled_normalizer(scale, max_value: float = 10.0) -> Callable[[jax.Array], jax.Array]:
    """loss / scale, clipped to `max_value`; non-finite -> `max_value`. `scale` may be traced
    (e.g. a task's expected initial loss), so an untrained task scores ~1."""

    def normalize(loss):
        x = loss / scale
        return jnp.where(jnp.isfinite(x), jnp.minimum(x, max_value), max_value)

    return normalize


def log_uniform(key: jax.Array, lo: float, hi: float, shape: tuple = ()) -> jax.Array:
    """exp(U[log lo, log hi)) float32 of `shape`: the usual draw of scales in task families."""
    return jnp.exp(jax.random.uniform(key, shape, jnp.float32, jnp.log(lo), jnp.log(hi)))


def check_range(value_range: tuple[float, float], what: str) -> tuple[float, float]:
    """(lo, hi) as floats, or ValueError naming `what` unless 0 < lo <= hi."""
    lo, hi = value_range
    if not 0 < lo <= hi:
        raise ValueError(f"{what} must satisfy 0 < lo <= hi, got {value_range}")
    return float(lo), float(hi)


def softmax_cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Mean cross-entropy of integer `labels` [B] under `logits` [B, C]."""
    logp = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(logp, labels[:, None].astype(jnp.int32), axis=-1))


def accuracy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    return jnp.mean(jnp.argmax(logits, axis=-1) == labels)


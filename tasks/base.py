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

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

Params = Any
ModelState = Any
Batch = Any


class Task:
    """One inner problem (see the module docstring). Subclasses implement `init` and `loss`, or,
    when the model has state (e.g. BatchNorm statistics), `init_with_state` and `loss_with_state`.

    Attributes:
      name: a label for logs and summaries.
      data: the task's DataSource, or None for data-free tasks (quadratics, 2-D functions).
    """

    name: str = "task"
    data: Any = None

    def init(self, key: jax.Array) -> Params:
        """Initial parameters.

        Args:
          key: PRNG key.

        Returns:
          params, a pytree of arrays.
        """
        return self.init_with_state(key)[0]

    def init_with_state(self, key: jax.Array) -> tuple[Params, ModelState]:
        """Initial parameters and model state (an empty dict for stateless tasks).

        Args:
          key: PRNG key.

        Returns:
          (params, model_state).
        """
        if type(self).init is Task.init:
            raise NotImplementedError(f"{type(self).__name__} must implement init or init_with_state")
        return self.init(key), {}

    def loss(self, params: Params, key: jax.Array, batch: Batch) -> jax.Array:
        """The training loss of a stateless task.

        Args:
          params: the parameters.
          key: PRNG key for any randomness of the loss (noise, dropout).
          batch: a batch from `data.batch(key, split)`, or None for data-free tasks.

        Returns:
          A scalar.
        """
        raise NotImplementedError(
            f"{type(self).__name__} does not implement loss; stateful tasks are used through loss_with_state"
        )

    def loss_with_state(
        self, params: Params, model_state: ModelState, key: jax.Array, batch: Batch
    ) -> tuple[jax.Array, ModelState]:
        """The training loss and the updated model state (every task supports this form).

        Args:
          params: the parameters.
          model_state: the model state (from `init_with_state` or the previous call).
          key: PRNG key for any randomness of the loss.
          batch: a batch, or None for data-free tasks.

        Returns:
          (scalar loss, new model_state).
        """
        if type(self).loss is Task.loss:
            raise NotImplementedError(f"{type(self).__name__} must implement loss or loss_with_state")
        return self.loss(params, key, batch), model_state

    def normalizer(self, loss: jax.Array) -> jax.Array:
        """Maps this task's loss to a scale comparable across tasks (meta-losses use it)."""
        return loss

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


class TaskFamily:
    """A distribution over tasks with one parameter structure (see the module docstring).

    Attributes:
      name: a label for logs and summaries.
      data: the DataSource all tasks of the family share, or None.
    """

    name: str = "task_family"
    data: Any = None

    def sample(self, key: jax.Array) -> Any:
        """Draws one task's configuration; jittable, so families vmap over keys.

        Args:
          key: PRNG key.

        Returns:
          cfg, a pytree of arrays.
        """
        raise NotImplementedError

    def task_fn(self, cfg: Any) -> Task:
        """The Task of a configuration from `sample` (which may be traced, inside jit / vmap).

        Args:
          cfg: a configuration from `sample`.

        Returns:
          The Task.
        """
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


def check_count(value: Any, what: str) -> int:
    """`value` as an int, or ValueError naming `what` unless it is an integer >= 1 (a batch size, a
    number of steps, tasks or seeds).

    Args:
      value: the value given.
      what: its name for the message, e.g. "ImageMLPFamily: batch_size".

    Returns:
      int(value).
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{what} must be an integer >= 1, got {value!r}")
    return int(value)


def softmax_cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Mean cross-entropy of integer `labels` [B] under `logits` [B, C]."""
    logp = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(logp, labels[:, None].astype(jnp.int32), axis=-1))


def accuracy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """The fraction of integer `labels` [B] that are the argmax of `logits` [B, C]: a scalar."""
    return jnp.mean(jnp.argmax(logits, axis=-1) == labels)

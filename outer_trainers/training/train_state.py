"""One model trained by one optax transform: its TrainState, one training step, and batch-averaged metrics.

    task = as_task(model, loss_fn, data)                       # a Task as is; flax linen/nnx or haiku via adapters
    state = init_train_state(task, tx, key, ema=True)
    state, loss = train_step(task, tx, state, data, ema_decay=0.999, ema_warmup_steps=100)
    loss = eval_loss(task, state.params, state.model_state, data, key, "test")

These are pure functions (keys in, state out): `outer_trainers.evaluation.comparison` vmaps them over
sampled tasks, and `outer_trainers.training.train_loop` drives them for one model with evaluation,
checkpoints and logging. Any optax transform works; a GradientTransformationExtraArgs (a learned
optimizer) also gets `loss=`.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from tasks.base import Task

BATCH_AXIS = "batch"
# metric(params, model_state, key, batch) -> scalar: what `mean_over_batches` averages.
Metric = Callable[[Any, Any, jax.Array, Any], jax.Array]


@struct.dataclass
class TrainState:
    """The state of training one model with an optax transform.

    Attributes:
        params: the model's parameters.
        model_state: its non-trained state (e.g. batch-norm statistics).
        opt_state: the optax transform's state.
        ema_params: a params-shaped exponential moving average of params, or None without EMA.
        step: int32 []: steps taken.
        key: the PRNG key the next step draws from (when `train_step` is given none).
    """
    params: Any
    model_state: Any
    opt_state: Any
    ema_params: Any
    step: jax.Array
    key: jax.Array


def init_train_state(task: Task, tx: optax.GradientTransformation, key: jax.Array, *,
                     ema: bool = False, step_key: Optional[jax.Array] = None) -> TrainState:
    """The state before the first step: params from `task.init_with_state(key)`, the optimizer's state
    and (optionally) the EMA.

    Args:
        task: the Task to train.
        tx: the optax transform.
        key: PRNG key for the task's init.
        ema: whether to keep an EMA of params (starting at the initial params).
        step_key: the key steps draw from when given none (default: `fold_in(key, 1)`).

    Returns:
        A TrainState at step 0.
    """
    params, model_state = task.init_with_state(key)
    step_key = jax.random.fold_in(key, 1) if step_key is None else step_key
    return TrainState(params, model_state, tx.init(params), params if ema else None,
                      jnp.zeros((), jnp.int32), step_key)


def apply_tx(tx: optax.GradientTransformation, grads: Any, opt_state: Any, params: Any, loss: jax.Array):
    """`tx.update(grads, opt_state, params)`, with `loss=` for transforms that take extra args.

    Args:
        tx: an optax transform; a GradientTransformationExtraArgs (e.g. a learned optimizer) also gets `loss`.
        grads: the gradients.
        opt_state: tx's state.
        params: the current params.
        loss: the loss at params.

    Returns:
        (updates, new opt_state).
    """
    if isinstance(tx, optax.GradientTransformationExtraArgs):
        return tx.update(grads, opt_state, params, loss=loss)
    return tx.update(grads, opt_state, params)


def ema_decay_at(step: jax.Array, decay: float, warmup_steps: int = 0) -> jax.Array:
    """The EMA decay used at a step, ramped in linearly over the first `warmup_steps` steps.

    decay_t = decay · min(1, t / warmup_steps)  (decay_t = decay when warmup_steps = 0), so early EMA
    values follow the fast-moving params instead of averaging in the initialisation.

    Args:
        step: int []: t, the steps taken after this update (1 for the first step); may be traced.
        decay: the EMA's decay after the warm-up, in [0, 1).
        warmup_steps: steps over which the decay ramps from 0 to `decay` (0: no warm-up).

    Returns:
        float32 []: decay_t.
    """
    if warmup_steps <= 0:
        return jnp.asarray(decay, jnp.float32)
    return decay * jnp.minimum(1.0, jnp.asarray(step, jnp.float32) / warmup_steps)


def train_step(task: Task, tx: optax.GradientTransformation, state: TrainState, data: Any,
               key: Optional[jax.Array] = None, *, ema_decay: Optional[float] = None, ema_warmup_steps: int = 0,
               batch_sharding: Optional[NamedSharding] = None, split: str = "train", with_metrics: bool = False):
    """One training step: a batch, the gradient, the optax update and the EMA update.

    params' = params + tx.update(∇L(params)); ema' = d · ema + (1 − d) · params' with
    d = `ema_decay_at(step + 1, ema_decay, ema_warmup_steps)` (when the state has an EMA and `ema_decay` is set).

    Args:
        task: the Task.
        tx: the optax transform.
        state: the TrainState before the step.
        data: the DataSource batches come from (None for data-free tasks).
        key: the step's randomness; None draws it from `state.key`, which then advances.
        ema_decay: the EMA's decay, or None for no EMA update.
        ema_warmup_steps: steps over which the EMA decay ramps in (see `ema_decay_at`).
        batch_sharding: a sharding constraint for the batch (data parallelism), or None.
        split: the data split batches come from.
        with_metrics: return the step's metrics instead of only its loss.

    Returns:
        (new state, the step's train loss []), or with `with_metrics` (new state, {"loss": [],
        "grad_norm": []: the gradient's global norm}).
    """
    next_key = state.key
    if key is None:
        next_key, key = jax.random.split(state.key)
    k_data, k_loss = jax.random.split(key)
    batch = data.batch(k_data, split) if data is not None else None
    if batch_sharding is not None:
        batch = jax.tree_util.tree_map(lambda x: jax.lax.with_sharding_constraint(x, batch_sharding), batch)
    (loss, model_state), grads = jax.value_and_grad(task.loss_with_state, has_aux=True)(
        state.params, state.model_state, k_loss, batch)
    updates, opt_state = apply_tx(tx, grads, state.opt_state, state.params, loss)
    params = optax.apply_updates(state.params, updates)
    ema = state.ema_params
    if ema is not None and ema_decay is not None:
        d = ema_decay_at(state.step + 1, ema_decay, ema_warmup_steps)
        ema = jax.tree_util.tree_map(lambda e, p: (d * e + (1.0 - d) * p).astype(e.dtype), ema, params)
    new_state = TrainState(params, model_state, opt_state, ema, state.step + 1, next_key)
    if with_metrics:
        return new_state, {"loss": loss, "grad_norm": optax.tree.norm(grads)}
    return new_state, loss


def mean_over_batches(metrics: Mapping[str, Metric], params: Any, model_state: Any, data: Any, key: jax.Array,
                      split: str = "test", num_batches: int = 8) -> dict:
    """Each metric averaged over `num_batches` batches of `split` (evaluated once for data-free tasks).

    m̄ = (1/N) Σ_i m(params, model_state, k_i, data.batch(k_i, split)), with k_i = split(key, N)[i];
    every metric sees the same batches.

    Args:
        metrics: {name: metric(params, model_state, key, batch) -> scalar}.
        params: the params evaluated.
        model_state: their model state.
        data: the DataSource, or None for data-free tasks (batch None).
        key: PRNG key for the batches and the metrics.
        split: the data split.
        num_batches: N, the batches averaged over.

    Returns:
        {name: float32 []}.
    """
    if data is None:
        return {name: jnp.asarray(m(params, model_state, key, None), jnp.float32) for name, m in metrics.items()}

    def one(k):
        batch = data.batch(k, split)
        return {name: jnp.asarray(m(params, model_state, k, batch), jnp.float32) for name, m in metrics.items()}

    return jax.tree_util.tree_map(jnp.mean, jax.vmap(one)(jax.random.split(key, num_batches)))


def eval_loss(task: Task, params: Any, model_state: Any, data: Any, key: jax.Array, split: str = "test",
              num_batches: int = 8) -> jax.Array:
    """Mean loss over `num_batches` batches of `split` (the loss itself for data-free tasks).

    Args:
        task: the Task.
        params: its params.
        model_state: its model state.
        data: the DataSource, or None for data-free tasks.
        key: PRNG key for the batches and the loss.
        split: the data split.
        num_batches: batches averaged over.

    Returns:
        float [].
    """
    loss = lambda p, ms, k, b: task.loss_with_state(p, ms, k, b)[0]
    return mean_over_batches({"loss": loss}, params, model_state, data, key, split, num_batches)["loss"]


def as_task(task_or_model: Any, loss_fn: Optional[Callable] = None, data: Any = None, **adapter_kwargs) -> Task:
    """A Task as is; a flax module (linen or nnx constructor) or haiku function via the adapters.

    Args:
        task_or_model: a tasks.Task, a flax linen Module, an nnx constructor or a haiku function.
        loss_fn: the model's loss (required for a model; see `tasks.task_from_flax` / `task_from_haiku`).
        data: the DataSource (required for a model).
        **adapter_kwargs: passed to the adapter.

    Returns:
        A Task.
    """
    if isinstance(task_or_model, Task):
        return task_or_model
    if loss_fn is None or data is None:
        raise ValueError("a model (not a tasks.Task) needs loss_fn= and data= (a tasks.DataSource)")
    from tasks.adapters import task_from_flax, task_from_haiku
    import flax.linen as nn
    if isinstance(task_or_model, nn.Module) or getattr(task_or_model, "_lopt_flax", False):
        return task_from_flax(task_or_model, loss_fn, data, **adapter_kwargs)
    try:
        return task_from_haiku(task_or_model, loss_fn, data, **adapter_kwargs)
    except Exception as haiku_error:  # not a haiku function: maybe an nnx constructor
        try:
            return task_from_flax(task_or_model, loss_fn, data, **adapter_kwargs)
        except Exception:
            raise haiku_error


def data_parallel_sharding(data: Any, devices: Optional[Sequence[jax.Device]] = None) -> Optional[NamedSharding]:
    """A batch-axis NamedSharding for data parallelism, or None when it does not apply.

    Args:
        data: the DataSource (None: no data, no sharding).
        devices: the devices (default: all local ones).

    Returns:
        A NamedSharding over a 1-D mesh on axis BATCH_AXIS, or None with fewer than two devices, no
        data, or a batch size the device count does not divide.
    """
    devices = list(jax.local_devices() if devices is None else devices)
    if len(devices) < 2 or data is None or getattr(data, "batch_size", 0) % len(devices):
        return None
    return NamedSharding(Mesh(np.asarray(devices), (BATCH_AXIS,)), P(BATCH_AXIS))

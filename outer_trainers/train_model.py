"""train_model: train one model with any optax transform — a meta-trained optimizer or a baseline.

    result = train_model(task, optax.adam(1e-3), 1000)                      # a tasks.Task
    result = train_model(flax_module, tx, 1000, loss_fn=loss, data=data)    # flax linen/nnx or haiku fn
    result.losses [num_steps], result.eval_loss, result.state.params (.ema_params with ema_decay)

The pure pieces (`init_train_state`, `train_step`, `eval_loss`) are what the vmapped evaluation
trainers (`outer_trainers.evaluation.make_task_trainer`, used by meta-evaluation and
scripts/evaluate.py) run per task; `train_model` adds the driver: steps in jitted `lax.scan`
chunks, data parallelism over local devices (a 1-D `Mesh` with the batch axis sharded and
params replicated, when there is more than one device and the batch divides evenly), an
optional EMA of params, and checkpoint/resume of the whole TrainState. It lives in
outer_trainers because it is the inner-training driver the evaluation code shares; lopt/
stays optimizer-only and tasks/ model-only.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from outer_trainers.checkpoints import CheckpointManager, CheckpointPolicy
from tasks.base import Task

BATCH_AXIS = "batch"


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


def train_step(task: Task, tx: optax.GradientTransformation, state: TrainState, data: Any,
               key: Optional[jax.Array] = None, *, ema_decay: Optional[float] = None,
               batch_sharding: Optional[NamedSharding] = None, split: str = "train") -> tuple[TrainState, jax.Array]:
    """One training step: a batch, the gradient, the optax update and the EMA update.

    ema' = ema_decay · ema + (1 − ema_decay) · params' (when the state has an EMA and `ema_decay` is set).

    Args:
        task: the Task.
        tx: the optax transform.
        state: the TrainState before the step.
        data: the DataSource batches come from (None for data-free tasks).
        key: the step's randomness; None draws it from `state.key`, which then advances.
        ema_decay: the EMA's decay, or None for no EMA update.
        batch_sharding: a sharding constraint for the batch (data parallelism), or None.
        split: the data split batches come from.

    Returns:
        (new state, the step's train loss []).
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
        ema = jax.tree_util.tree_map(lambda e, p: ema_decay * e + (1.0 - ema_decay) * p, ema, params)
    return TrainState(params, model_state, opt_state, ema, state.step + 1, next_key), loss


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
    if data is None:
        return task.loss_with_state(params, model_state, key, None)[0]
    keys = jax.random.split(key, num_batches)
    return jnp.mean(jax.vmap(lambda k: task.loss_with_state(params, model_state, k, data.batch(k, split))[0])(keys))


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


class TrainResult(NamedTuple):
    """What `train_model` returns.

    Attributes:
        state: the final TrainState.
        losses: float32 [num_steps]: the train loss of every step.
        eval_loss: mean loss on `eval_split` after training (with params).
        ema_eval_loss: the same with the EMA params when `ema_decay` is set, else None.
    """
    state: TrainState
    losses: np.ndarray
    eval_loss: float
    ema_eval_loss: Optional[float]


def _run_chunk(task, tx, ema_decay, sharding, state, data, num):
    step = lambda s, _: train_step(task, tx, s, data, ema_decay=ema_decay, batch_sharding=sharding)
    return jax.lax.scan(step, state, None, length=num)


def train_model(task_or_model: Any, optimizer: optax.GradientTransformation, num_steps: int, *,
                loss_fn: Optional[Callable] = None, data: Any = None, seed: int = 0,
                key: Optional[jax.Array] = None, ema_decay: Optional[float] = None, chunk_size: int = 100,
                eval_split: str = "test", eval_batches: int = 8, checkpoint_dir: Optional[str] = None,
                checkpoint_every: Optional[int] = None, keep: int = 2,
                devices: Optional[Sequence[jax.Device]] = None) -> TrainResult:
    """Trains a model for `num_steps` steps of `optimizer` (any optax transform; learned ones get `loss=`).

    Steps run in jitted `lax.scan` chunks; with more than one device, data parallel (batch sharded,
    params replicated). With `checkpoint_dir`, the TrainState and losses are saved every
    `checkpoint_every` steps (and at the end) and a re-run resumes from the latest one, giving the
    same result as an uninterrupted run.

    Args:
        task_or_model: a tasks.Task, or a model for `as_task` (with `loss_fn` and `data`).
        optimizer: the optax transform.
        num_steps: training steps (>= 0).
        loss_fn: the model's loss (models only).
        data: the DataSource (default: the task's own).
        seed: seed of the run's key (when `key` is None).
        key: the run's PRNG key (init, steps and evaluation keys are split from it).
        ema_decay: keep an EMA of params with this decay (None: no EMA).
        chunk_size: steps per jitted chunk.
        eval_split: the data split of the final evaluation.
        eval_batches: batches the final evaluation averages over.
        checkpoint_dir: where to checkpoint and resume (None: no checkpoints).
        checkpoint_every: steps between checkpoints (None: only at the end).
        keep: checkpoints kept.
        devices: devices for data parallelism (default: all local).

    Returns:
        A TrainResult.
    """
    if num_steps < 0:
        raise ValueError(f"num_steps must be >= 0, got {num_steps}")
    task = as_task(task_or_model, loss_fn, data)
    data = task.data if data is None else data
    key = jax.random.key(seed) if key is None else key
    sharding = data_parallel_sharding(data, devices)
    k_init, k_train, k_eval = jax.random.split(key, 3)
    state = init_train_state(task, optimizer, k_init, ema=ema_decay is not None, step_key=k_train)
    if sharding is not None:
        replicated = NamedSharding(sharding.mesh, P())
        state = jax.device_put(state, replicated)
        data = jax.device_put(data, replicated)
    losses = np.full((num_steps,), np.nan, np.float32)

    mgr, meta = None, {"kind": "train_model", "num_steps": int(num_steps)}
    if checkpoint_dir is not None:
        mgr = CheckpointManager(checkpoint_dir, CheckpointPolicy(every_steps=checkpoint_every, every_seconds=None,
                                                                 keep=keep))
        found = mgr.restore_latest({"state": state, "losses": losses}, expect=meta)
        if found is not None:
            restored = found[0]
            state, losses = restored["state"], np.array(restored["losses"])
            if sharding is not None:
                state = jax.device_put(state, NamedSharding(sharding.mesh, P()))

    run = jax.jit(functools.partial(_run_chunk, task, optimizer, ema_decay, sharding), static_argnums=(2,))
    step = int(state.step)
    while step < num_steps:
        stop = num_steps
        if checkpoint_every:
            stop = min(stop, (step // checkpoint_every + 1) * checkpoint_every)
        n = min(chunk_size, stop - step)
        state, chunk_losses = run(state, data, n)
        losses[step:step + n] = np.asarray(chunk_losses)
        step += n
        if mgr is not None and (step == num_steps or (checkpoint_every and step % checkpoint_every == 0)):
            mgr.save(step, {"state": state, "losses": losses}, meta=meta)

    evaluate = jax.jit(lambda p, ms, d, k: eval_loss(task, p, ms, d, k, eval_split, eval_batches))
    final = float(evaluate(state.params, state.model_state, data, k_eval))
    ema_final = None
    if ema_decay is not None:
        ema_final = float(evaluate(state.ema_params, state.model_state, data, k_eval))
    return TrainResult(state, losses, final, ema_final)

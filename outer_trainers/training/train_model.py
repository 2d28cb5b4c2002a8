"""train_model: train one model with any optax transform — a meta-trained optimizer or a baseline.

    result = train_model(task, optax.adam(1e-3), 1000)                      # a tasks.Task
    result = train_model(flax_module, tx, 1000, loss_fn=loss, data=data)    # flax linen/nnx or haiku fn
    result = train_model(task, tx, 10_000, output_dir="run", evaluation=EvalPlan(every=500), ema_decay=0.999,
                         checkpoint_policy=CheckpointPolicy(every_steps=1000, keep=3, checkpoints_at=(5000,)),
                         options=LoopOptions(log_every=50, progress="log"))
    result.losses [num_steps], result.eval_loss, result.evals, result.state.params (.ema_params with ema_decay)

`train_model` runs `outer_trainers.training.train_loop.train_loop` (evaluation during training, rolling and
permanent checkpoints written in the background, exact resume, metrics.jsonl / TensorBoard /
progress, callbacks, data parallelism or the state split over a mesh, EMA with warm-up) to the end and returns its TrainResult;
iterate `train_loop` itself to see the TrainState during training. The pure pieces it is built
from (`TrainState`, `init_train_state`, `train_step`, `eval_loss`, `as_task`) live in
`outer_trainers.training.train_state` and are re-exported here: the vmapped evaluation trainers
(`outer_trainers.evaluation.comparison`) run them per task.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import jax
import optax

from outer_trainers.runs.checkpoint_policy import CheckpointPolicy
from outer_trainers.training.train_loop import TrainResult, run_to_end, train_loop


def train_model(task_or_model: Any, optimizer: optax.GradientTransformation, num_steps: int, *,
                loss_fn: Optional[Callable] = None, data: Any = None, seed: int = 0,
                key: Optional[jax.Array] = None, ema_decay: Optional[float] = None,
                checkpoint_dir: Optional[str] = None, checkpoint_every: Optional[int] = None, keep: int = 2,
                devices: Optional[Sequence[jax.Device]] = None, **loop_options) -> TrainResult:
    """Trains a model for `num_steps` steps of `optimizer` (any optax transform; learned ones get `loss=`).

    `train_loop` run to the end. With `checkpoint_dir` (or `output_dir`), a re-run resumes from the
    newest checkpoint and gives the same result as an uninterrupted run. A finished (or interrupted)
    run is trained further by calling again with a larger `num_steps` and `extend=True` (without it
    that resume is refused): the state continues from the checkpoint, and `optimizer` should be built
    for the new horizon — with a constant-rate optimizer the result equals a run started with the
    larger `num_steps`; with a schedule over num_steps, the steps already taken keep the old
    horizon's values and the later ones get the new horizon's (`outer_trainers.training.train_resume`).

    Args:
        task_or_model: a tasks.Task, or a model for `as_task` (with `loss_fn` and `data`).
        optimizer: the optax transform.
        num_steps: training steps (>= 0).
        loss_fn: the model's loss (models only).
        data: the DataSource (default: the task's own).
        seed: seed of the run's key (when `key` is None).
        key: the run's PRNG key (init, steps and evaluation keys are split from it).
        ema_decay: keep an EMA of params with this decay (None: no EMA).
        checkpoint_dir: where checkpoints go (None: `output_dir`/checkpoints, or none without `output_dir`).
        checkpoint_every: steps between rolling checkpoints, when no `checkpoint_policy` is given (None: only at
            the end).
        keep: rolling checkpoints kept, when no `checkpoint_policy` is given.
        devices: devices for data parallelism (default: all local).
        **loop_options: `train_loop`'s other keyword arguments (evaluation (an `EvalPlan`), output_dir,
            checkpoint_policy, resume, overwrite, extend, options (a `LoopOptions` without `yield_every`),
            ema_warmup_steps, config, sharding (a `ParamSharding`: params, optimizer state and batches split
            over a mesh axis, instead of `devices`)).

    Returns:
        A TrainResult.
    """
    if getattr(loop_options.get("options"), "yield_every", None) is not None:
        raise TypeError("train_model does not yield states; iterate train_loop(..., options=LoopOptions("
                        "yield_every=N)) instead")
    loop_options.setdefault("checkpoint_policy", CheckpointPolicy(every_steps=checkpoint_every, every_seconds=None,
                                                                  keep=keep))
    loop = train_loop(task_or_model, optimizer, num_steps, loss_fn=loss_fn, data=data, seed=seed, key=key,
                      ema_decay=ema_decay, checkpoint_dir=checkpoint_dir, devices=devices, **loop_options)
    return run_to_end(loop)

"""Training many sampled tasks with one optax optimizer in one jitted program.

    trainer = make_task_trainer(family, make_tx, num_steps)
    losses, evals = trainer(tx_args, cfgs, keys, family.data)
    trainer = make_task_trainer(family, make_tx, num_steps, valid_split="inner_valid", valid_points=20)
    out = trainer(tx_args, cfgs, keys, family.data)   # {"losses", "evals", "valids", "valid_curve"[, "accuracy"]}

trains every task cfg (vmapped) for `num_steps` with `make_tx(tx_args)` (tx_args traced, so an
lr grid or a new theta reuses one compiled program) and returns per-step train losses
[num_tasks, num_steps] and the final loss on `eval_split` [num_tasks]; with a `valid_split`, the
same program also measures the validation loss at the `valid_schedule` steps (the last one is the
end of training) and, for an image classifier, the accuracy on `eval_split`. Every other evaluation
module trains through it: `sample_cfgs` and `task_draws` draw the tasks, `run_settings` runs a
list of optimizer settings on the same draws, `run_fixed` runs one setting (a learned optimizer's
theta) and returns the run dict that the protocol's functions score.

A run dict, for S runs (seeds or task draws) of T steps::

    "optimizer"      name
    "learning_rate"  float (NaN when there is none)
    "losses"         [S, T] train losses
    "evals"          [S] test losses: the loss on the eval split after training
    "valids"         [S] validation losses after training (the tuning rule reads these)
    "valid_curve"    [S, K] validation losses after each of the K steps of "valid_steps"
    "valid_steps"    [K] 1-based step counts, ascending, the last one T (`valid_schedule`)
    "accuracy"       [S] test accuracy (image classifiers only: `train_eval.is_image_classifier`)

The held-out losses ("evals", "valids", "valid_curve") are measured in inference mode where a task
has one: a task with an `eval_loss(params, model_state, key, batch)` method (`tasks.ConvBNTask`:
BatchNorm by its running statistics, no dropout) is scored by it, as a trained model is used; every
other task by its `loss_with_state`. The last four come with a validation split (`run_settings`, `run_fixed` and
`tuning.tune_learning_rate` measure one by default: `VALID_SPLIT`). A task without data (a
quadratic) has one objective: its validation and test losses are that loss at the final
parameters, measured with their own keys.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from outer_trainers.training.train_eval import default_metrics
from outer_trainers.training.train_state import init_train_state, mean_over_batches, train_step
from tasks.base import TaskFamily, check_count

MakeTx = Callable[[Any], optax.GradientTransformation]
Setting = tuple[str, MakeTx, Sequence[tuple[float, Any]]]
VALID_SPLIT = "inner_valid"  # the split a user tunes on: disjoint from train and test, and not meta-training's outer_valid
VALID_POINTS = 20            # validation losses measured per run, evenly spaced, the last at the end


def valid_schedule(num_steps: int, valid_points: int) -> tuple[int, ...]:
    """The steps after which a run's validation loss is measured: K = min(valid_points, T) points.

    With c = T // K and r = T - K * c, the points are r + c * k for k = 1 .. K: evenly spaced, the
    last one at T (the end of training), the remainder r taken up before the first.

    Args:
      num_steps: T, the steps of the run (>= 1).
      valid_points: how many points wanted (>= 1).

    Returns:
      the K step counts (1-based: after that many steps), ascending.
    """
    t = check_count(num_steps, "valid_schedule: num_steps")
    k = min(check_count(valid_points, "valid_schedule: valid_points"), t)
    c = t // k
    return tuple(t - k * c + c * (i + 1) for i in range(k))


def held_out_metrics(task: Any) -> dict:
    """The metrics of a task's held-out losses: `default_metrics`, its "loss" the task's `eval_loss` when it has one.

    Args:
      task: the Task.

    Returns:
      {"loss": metric[, "accuracy": metric]}, each `metric(params, model_state, key, batch) -> scalar`.
    """
    metrics = dict(default_metrics(task))
    if callable(getattr(task, "eval_loss", None)):
        metrics["loss"] = task.eval_loss
    return metrics


def make_task_trainer(family: TaskFamily, make_tx: MakeTx, num_steps: int, *, eval_split: str = "test",
                      eval_batches: int = 8, normalize: bool = False, batched_args: bool = False,
                      sequential: bool = False, valid_split: Optional[str] = None, valid_points: int = 1) -> Callable:
    """A jitted trainer of many sampled tasks with one optimizer: `fn(tx_args, cfgs, keys, data)`.

    Each task `family.task_fn(cfg)` starts from `train_model`'s `init_train_state` and takes
    `num_steps` `train_step`s with `make_tx(tx_args)` under `lax.scan`; the T tasks are vmapped
    over `cfgs`, `keys` and a copy of `tx_args` each. `tx_args` is traced, so one compile serves
    every lr or theta.

    Args:
      family: the task family whose `task_fn` builds each task from its cfg.
      make_tx: tx_args -> the optax optimizer (e.g. `optax.adam`, or `lambda th: lo.opt_fn(th)`).
      num_steps: inner training steps per task.
      eval_split: the data split of the loss measured after training.
      eval_batches: batches averaged for that loss.
      normalize: pass train and eval losses through each task's `normalizer` (comparable across tasks).
      batched_args: `tx_args` has a leading axis of A settings (e.g. A learning rates), vmapped too,
        so one program trains all A x T runs; the outputs get that leading axis.
      sequential: run the A x T runs one after another (`lax.map`) inside the one program instead of
        vmapping them: the same numbers, faster for convnets on CPU, where a vmap over weights
        becomes a grouped convolution.
      valid_split: also measure the loss on this split (`eval_batches` batches) at the
        `valid_schedule(num_steps, valid_points)` steps, inside the same program: the training
        runs as a scan over K chunks of steps, each followed by one validation measurement (the
        train losses are those of one scan over all steps). None: no validation loss.
      valid_points: K, the validation measurements per run (with `valid_split`).

    Returns:
      `fn(tx_args, cfgs, keys, data)`, where `cfgs` is a batch of T task cfgs (see `sample_cfgs`),
      `keys` [T] the run keys and `data` the family's `data`. Without `valid_split` it returns
      `(train_losses [T, num_steps], eval_losses [T])`; with one, `{"losses" [T, num_steps],
      "evals" [T], "valids" [T] (the last point of the curve), "valid_curve" [T, K]}` plus
      "accuracy" [T] on `eval_split` for an image classifier (`train_eval.is_image_classifier`).
      With `batched_args` every output has a leading axis of A. ValueError unless num_steps,
      eval_batches, valid_points >= 1.
    """
    num_steps = check_count(num_steps, "make_task_trainer: num_steps")
    eval_batches = check_count(eval_batches, "make_task_trainer: eval_batches")
    schedule = valid_schedule(num_steps, valid_points) if valid_split is not None else None

    def train_plain(task, tx, state, data, keys):
        return jax.lax.scan(lambda s, k: train_step(task, tx, s, data, k), state, keys)

    def train_one(tx_args, cfg, key, data):
        task = family.task_fn(cfg)
        tx = make_tx(tx_args)
        k_init, k_train, k_eval = jax.random.split(key, 3)
        state = init_train_state(task, tx, k_init)
        keys = jax.random.split(k_train, num_steps)
        if schedule is None:
            state, losses = train_plain(task, tx, state, data, keys)
            final = mean_over_batches({"loss": held_out_metrics(task)["loss"]}, state.params, state.model_state, data,
                                      k_eval, eval_split, eval_batches)["loss"]
            if normalize:
                losses, final = task.normalizer(losses), task.normalizer(final)
            return losses, final
        k_valid = jax.random.fold_in(k_eval, 1)
        loss_only = {"loss": held_out_metrics(task)["loss"]}
        valid = lambda s: mean_over_batches(loss_only, s.params, s.model_state, data, k_valid, valid_split,
                                            eval_batches)["loss"]
        chunk = num_steps // len(schedule)
        head = num_steps - chunk * len(schedule)
        state, head_losses = train_plain(task, tx, state, data, keys[:head])

        def one_chunk(s, ks):
            s, chunk_losses = train_plain(task, tx, s, data, ks)
            return s, (chunk_losses, valid(s))

        state, (chunk_losses, curve) = jax.lax.scan(
            one_chunk, state, keys[head:].reshape((len(schedule), chunk) + keys.shape[1:]))
        losses = jnp.concatenate([head_losses, chunk_losses.reshape(-1)])
        metrics = mean_over_batches(held_out_metrics(task), state.params, state.model_state, data, k_eval,
                                    eval_split, eval_batches)
        out = {"losses": losses, "evals": metrics["loss"], "valid_curve": curve}
        if normalize:
            out = {k: task.normalizer(v) for k, v in out.items()}
        out["valids"] = out["valid_curve"][-1]
        if "accuracy" in metrics:
            out["accuracy"] = metrics["accuracy"]
        return out

    if sequential:
        return jax.jit(functools.partial(_in_sequence, train_one, batched_args))

    def over_tasks(tx_args, cfgs, keys, data):
        # each task gets its own copy of tx_args, so a learned optimizer's weights are batched like
        # the activations they multiply: one batched GEMM per layer (see lopt.MLPLOpt)
        per_task = jax.tree_util.tree_map(lambda a: jnp.broadcast_to(a, keys.shape[:1] + jnp.shape(a)), tx_args)
        return jax.vmap(train_one, in_axes=(0, 0, 0, None))(per_task, cfgs, keys, data)

    return jax.jit(jax.vmap(over_tasks, in_axes=(0, None, None, None)) if batched_args else over_tasks)


def _in_sequence(train_one: Callable, batched_args: bool, tx_args, cfgs, keys, data):
    """`make_task_trainer`'s runs through `lax.map`: every (setting, task) pair in turn."""
    if not batched_args:
        return jax.lax.map(lambda x: train_one(tx_args, x[0], x[1], data), (cfgs, keys))
    num_args, num_tasks = jax.tree_util.tree_leaves(tx_args)[0].shape[0], keys.shape[0]
    args = jax.tree_util.tree_map(lambda a: jnp.repeat(a, num_tasks, axis=0), tx_args)
    tile = lambda c: jnp.tile(c, (num_args,) + (1,) * (c.ndim - 1))
    out = jax.lax.map(lambda x: train_one(x[0], x[1], x[2], data),
                      (args, jax.tree_util.tree_map(tile, cfgs), tile(keys)))
    return jax.tree_util.tree_map(lambda o: o.reshape((num_args, num_tasks) + o.shape[1:]), out)


def sample_cfgs(family: TaskFamily, key: jax.Array, num_tasks: int) -> Any:
    """Draws `num_tasks` task cfgs of `family`, batched for `make_task_trainer`.

    Args:
      family: the task family to sample.
      key: PRNG key; split into `num_tasks` keys, one per `family.sample` call.
      num_tasks: how many cfgs to draw.

    Returns:
      the cfgs stacked along a leading axis: a pytree whose leaves are [num_tasks, ...].
    """
    return jax.vmap(family.sample)(jax.random.split(key, check_count(num_tasks, "sample_cfgs: num_tasks")))


def task_draws(family: TaskFamily, seeds: Sequence[int]) -> tuple[Any, jax.Array]:
    """The task cfgs and run keys of `seeds`, the same for every optimizer evaluated on them.

    Seed s draws its cfg from `fold_in(key(s), 0)` and runs with `fold_in(key(s), 1)`, so every
    optimizer sees the same tasks and initialisations, and a seed means the same draw in every
    evaluation.

    Args:
      family: the task family.
      seeds: one task draw and run key per seed.

    Returns:
      (cfgs batched over seeds, run keys [S]).
    """
    keys = [jax.random.key(s) for s in seeds]
    cfgs = jax.vmap(family.sample)(jnp.stack([jax.random.fold_in(k, 0) for k in keys]))
    return cfgs, jnp.stack([jax.random.fold_in(k, 1) for k in keys])


def run_dict(name: str, learning_rate: float, out: dict, num_steps: int, valid_points: int) -> dict:
    """A run dict (module docstring; float64 numpy) from a validating trainer's outputs for one setting.

    Args:
      name: the optimizer's name.
      learning_rate: its rate (NaN when there is none).
      out: `make_task_trainer(..., valid_split=...)`'s outputs for one setting: {"losses" [S, T], ...}.
      num_steps: T.
      valid_points: the trainer's `valid_points`.

    Returns:
      the run dict, with "valid_steps" = `valid_schedule(num_steps, valid_points)`.
    """
    run = {"optimizer": name, "learning_rate": float(learning_rate)}
    run.update({k: np.asarray(v, np.float64) for k, v in jax.device_get(out).items()})
    run["valid_steps"] = np.asarray(valid_schedule(num_steps, valid_points))
    return run


def run_settings(family: TaskFamily, settings: Sequence[Setting], cfgs: Any, keys: jax.Array, num_steps: int, *,
                 eval_split: str = "test", valid_split: str = VALID_SPLIT, valid_points: int = 1) -> list[dict]:
    """Trains the same T tasks with every optimizer setting: one compile per optimizer.

    Every setting sees the same task draws and initialisations (`cfgs`, `keys`), so their
    losses are comparable run by run.

    Args:
      family: the task family `cfgs` were drawn from.
      settings: `(name, make_tx, [(learning_rate, tx_args), ...])` per optimizer; each name compiles
        once with its tx_args traced. learning_rate is only a label: NaN where there is none, as
        for a theta.
      cfgs: T task cfgs (see `sample_cfgs`).
      keys: run keys [T].
      num_steps: inner training steps per task.
      eval_split: the data split of the loss measured after training (the test loss).
      valid_split: the validation split (`make_task_trainer`).
      valid_points: validation measurements per run.

    Returns:
      run dicts (module docstring: "losses" [T, num_steps], "evals", "valids" [T], ...; float64),
      one per grid point, in the order of `settings`. ValueError for an empty grid or num_steps < 1,
      before anything runs.
    """
    check_count(num_steps, "run_settings: num_steps")
    for name, _, grid in settings:
        if not len(grid):
            raise ValueError(f"run_settings: the grid of setting {name!r} is empty; give it at least one point")
    runs = []
    for name, make_tx, grid in settings:
        trainer = make_task_trainer(family, make_tx, num_steps, eval_split=eval_split, valid_split=valid_split,
                                    valid_points=valid_points)
        for lr, args in grid:
            runs.append(run_dict(name, lr, trainer(args, cfgs, keys, family.data), num_steps, valid_points))
    return runs


def run_fixed(family: TaskFamily, name: str, make_tx: MakeTx, tx_args: Any, cfgs: Any, keys: jax.Array,
              num_steps: int, *, eval_split: str = "test", eval_batches: int = 8, sequential: bool = False,
              valid_split: str = VALID_SPLIT, valid_points: int = 1) -> dict:
    """Trains every seed with one optimizer setting (a learned optimizer's theta): one program.

    The untuned counterpart of `tune_learning_rate`: the run of an optimizer that is not tuned
    (a learned optimizer, told its horizon through `make_tx`).

    Args:
      family: the task family `cfgs` were drawn from.
      name: the optimizer's name in the run.
      make_tx: tx_args -> the optax transform.
      tx_args: its argument (traced), e.g. theta.
      cfgs: S task cfgs.
      keys: S run keys.
      num_steps: training steps per run.
      eval_split: the data split of the held-out loss after training.
      eval_batches: batches averaged for that loss.
      sequential: run the seeds one after another in the program (`make_task_trainer`).
      valid_split: the validation split.
      valid_points: validation measurements per run (`valid_schedule`).

    Returns:
      the run dict (module docstring), "learning_rate" NaN, float64.
    """
    trainer = make_task_trainer(family, make_tx, num_steps, eval_split=eval_split, eval_batches=eval_batches,
                                sequential=sequential, valid_split=valid_split, valid_points=valid_points)
    return run_dict(name, float("nan"), trainer(tx_args, cfgs, keys, family.data), num_steps, valid_points)

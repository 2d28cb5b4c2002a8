"""Training sampled tasks with any optax optimizer, to compare learned optimizers with baselines.

    trainer = make_task_trainer(family, make_tx, num_steps)
    losses, evals = trainer(tx_args, cfgs, keys, family.data)

trains every task cfg (vmapped) for `num_steps` with `make_tx(tx_args)` (tx_args traced, so an
lr grid or a new theta reuses one compiled program) and returns per-step train losses
[num_tasks, num_steps] and the final loss on `eval_split` [num_tasks]. `run_settings` runs a list
of optimizer settings (lr grids) on the same task draws; `best_runs` is the one rule that tunes a
baseline's learning rate on them; `compare_optimizers` / `format_comparison` are the learned
optimizer vs tuned Adam report that `scripts/outer_train.py` prints, by the rules of
`outer_trainers.evaluation.protocol` (grid extension at an edge, time to reach and speedup).
"""
from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from lopt import features as lopt_features
from outer_trainers.training.train_state import eval_loss, init_train_state, train_step
from tasks.base import TaskFamily, check_count

MakeTx = Callable[[Any], optax.GradientTransformation]
Setting = tuple[str, MakeTx, Sequence[tuple[float, Any]]]


def make_task_trainer(family: TaskFamily, make_tx: MakeTx, num_steps: int, *, eval_split: str = "test",
                      eval_batches: int = 8, normalize: bool = False, batched_args: bool = False,
                      sequential: bool = False) -> Callable:
    """A jitted trainer of many sampled tasks with one optimizer: `fn(tx_args, cfgs, keys, data)`.

    Each task `family.task_fn(cfg)` starts from `train_model`'s `init_train_state` and takes
    `num_steps` `train_step`s with `make_tx(tx_args)` under `lax.scan`; the T tasks are vmapped
    over `cfgs` and `keys`. `tx_args` is traced, so one compile serves every lr or theta.

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

    Returns:
      `fn(tx_args, cfgs, keys, data) -> (train_losses [T, num_steps], eval_losses [T])`, where
      `cfgs` is a batch of T task cfgs (see `sample_cfgs`), `keys` [T] the run keys and `data`
      the family's `data` (with `batched_args`: [A, T, num_steps] and [A, T]).
      ValueError unless num_steps, eval_batches >= 1.
    """
    num_steps = check_count(num_steps, "make_task_trainer: num_steps")
    eval_batches = check_count(eval_batches, "make_task_trainer: eval_batches")

    def train_one(tx_args, cfg, key, data):
        task = family.task_fn(cfg)
        # vmapped over the tasks (and settings): blocks sized for a batch (lopt.features)
        with contextlib.nullcontext() if sequential else lopt_features.batched_updates():
            tx = make_tx(tx_args)
        k_init, k_train, k_eval = jax.random.split(key, 3)
        state = init_train_state(task, tx, k_init)
        state, losses = jax.lax.scan(lambda s, k: train_step(task, tx, s, data, k), state,
                                     jax.random.split(k_train, num_steps))
        final = eval_loss(task, state.params, state.model_state, data, k_eval, eval_split, eval_batches)
        if normalize:
            losses, final = task.normalizer(losses), task.normalizer(final)
        return losses, final

    if sequential:
        return jax.jit(functools.partial(_in_sequence, train_one, batched_args))
    over_tasks = jax.vmap(train_one, in_axes=(None, 0, 0, None))
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


def final_loss(losses) -> np.ndarray:
    """The "final" loss of training curves: the mean of the last 10% of steps (at least one).

    Args:
      losses: per-step losses [..., num_steps].

    Returns:
      numpy array [...].
    """
    losses = np.asarray(losses)
    tail = max(1, losses.shape[-1] // 10)
    return np.mean(losses[..., -tail:], axis=-1)


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


def run_settings(family: TaskFamily, settings: Sequence[Setting], cfgs: Any, keys: jax.Array, num_steps: int, *,
                 eval_split: str = "test") -> list[dict]:
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
      eval_split: the data split of the loss measured after training.

    Returns:
      `[{"optimizer": name, "learning_rate": float, "losses": [T, num_steps], "evals": [T]}]` (numpy),
      one per grid point, in the order of `settings`. ValueError for an empty grid or num_steps < 1,
      before anything runs.
    """
    check_count(num_steps, "run_settings: num_steps")
    for name, _, grid in settings:
        if not len(grid):
            raise ValueError(f"run_settings: the grid of setting {name!r} is empty; give it at least one point")
    runs = []
    for name, make_tx, grid in settings:
        trainer = make_task_trainer(family, make_tx, num_steps, eval_split=eval_split)
        for lr, args in grid:
            losses, evals = jax.device_get(trainer(args, cfgs, keys, family.data))
            runs.append({"optimizer": name, "learning_rate": float(lr), "losses": np.asarray(losses),
                         "evals": np.asarray(evals)})
    return runs


def lr_grid(lrs: Sequence[float]) -> list[tuple[float, jax.Array]]:
    """A learning-rate grid as `run_settings` takes it, for make_tx = lr -> optimizer.

    Args:
      lrs: the learning rates, at least one, each finite and > 0.

    Returns:
      `[(lr, lr as a float32 scalar array)]`: the label and the traced tx_args of each point.
    """
    return [(lr, jnp.asarray(lr, jnp.float32)) for lr in check_learning_rates(lrs, "lr_grid")]


def check_learning_rates(lrs: Sequence[float], what: str) -> list[float]:
    """The grid as floats, or ValueError naming `what` unless it is non-empty and every rate is finite and > 0.

    Args:
      lrs: the learning rates.
      what: the argument's name for the message, e.g. "evaluate: adam_lrs".

    Returns:
      the learning rates as a list of floats.
    """
    try:
        rates = [float(lr) for lr in lrs]
    except (TypeError, ValueError) as e:
        raise ValueError(f"{what} must be a sequence of learning rates, got {lrs!r} ({e})") from None
    if not rates or not all(np.isfinite(lr) and lr > 0 for lr in rates):
        raise ValueError(f"{what} must hold at least one learning rate, each finite and > 0, got {lrs!r}")
    return rates


def _tuning_score(losses) -> float:
    """Median over runs of the final train loss; inf if any run is non-finite."""
    finals = final_loss(losses)
    return float(np.median(finals)) if np.all(np.isfinite(finals)) else float("inf")


def best_runs(runs: Sequence[dict]) -> dict[str, dict]:
    """Each optimizer's best setting: the rule that tunes a baseline's learning rate.

    A setting's score is the median, over its runs (tasks or seeds), of the final train loss
    (`final_loss`: mean of the last 10% of steps); a setting with any non-finite (diverged) run
    loses. Lowest score wins; ties go to the earlier setting. The median keeps one hard task
    draw from deciding the grid point; the train loss keeps test data out of tuning.
    No winner is named silently: when every setting of an optimizer diverged, its entry is
    its first setting marked `"diverged": True` (a copy; reports must say so).

    Args:
      runs: `run_settings` output: dicts with "optimizer" and "losses" [runs, num_steps].

    Returns:
      `{optimizer name: its best run}`, in the order the names first appear in `runs`; a run
      of an optimizer whose every setting diverged has `"diverged": True`.
    """
    best, scores = {}, {}
    for r in runs:
        name, score = r["optimizer"], _tuning_score(r["losses"])
        if name not in best or score < scores[name]:
            best[name], scores[name] = r, score
    return {name: r if np.isfinite(scores[name]) else {**r, "diverged": True} for name, r in best.items()}


def compare_optimizers(family: TaskFamily, learned_tx: MakeTx, theta: Any, *, num_tasks: int, num_steps: int,
                       key: jax.Array, adam_lrs: Sequence[float] = (1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1, 1.0),
                       eval_split: str = "test", max_extensions: int = 4, min_grid_points: int = 7) -> dict:
    """The learned optimizer vs Adam tuned by the evaluation protocol, on held-out task draws of `family`.

    `outer_trainers.evaluation.protocol`'s rules with the `num_tasks` draws as the seeds: both train the same
    draws and initialisations; Adam runs every rate of its grid on every draw (one program), the
    best rate is `best_runs`'s (lowest median final train loss over draws, a diverged draw loses),
    and the grid is extended past an edge holding the best rate. A grid of fewer than
    `min_grid_points` rates is first replaced by that many log-spaced rates spanning it (a decade
    either side of a single rate).

    Args:
      family: the task family the held-out tasks are drawn from.
      learned_tx: theta -> the learned optimizer's optax transform.
      theta: the learned optimizer's meta-parameters.
      num_tasks: how many tasks to draw.
      num_steps: inner training steps per task.
      key: PRNG key of the task draws and training runs.
      adam_lrs: Adam's starting learning-rate grid.
      eval_split: the data split of the loss measured after training.
      max_extensions: the most grid extensions (2 rates each).
      min_grid_points: the fewest rates a grid is tuned over.

    Returns:
      `{name: {"final_train": mean over tasks of the final train loss, "final_train_median": its
      median over tasks (the statistic `best_runs` ranks by), "eval": mean eval loss, "curve": mean
      train loss per step (num_steps floats)}}` for "learned" and each "adam(lr=...)" in ascending
      rate, plus "best_adam": the name of the best Adam entry, or None when every learning rate
      diverged, and "protocol": {"grid_edge": `protocol.grid_edge` of Adam's runs, "compare":
      `protocol.compare_runs(learned, best Adam)` (time to reach, speedup, ratios) or None}.
      ValueError, before anything runs, unless num_tasks, num_steps >= 1 and the grid is non-empty,
      finite and positive.
    """
    from outer_trainers import protocol  # protocol builds on this module
    check_count(num_tasks, "compare_optimizers: num_tasks")
    check_count(num_steps, "compare_optimizers: num_steps")
    lrs = sorted(check_learning_rates(adam_lrs, "compare_optimizers: adam_lrs"))
    if len(lrs) < min_grid_points:
        lo, hi = (lrs[0], lrs[-1]) if len(lrs) > 1 else (lrs[0] / 10, lrs[0] * 10)
        lrs = [float(x) for x in np.geomspace(lo, hi, min_grid_points)]
    k_cfg, k_run = jax.random.split(key)
    cfgs = sample_cfgs(family, k_cfg, num_tasks)
    keys = jax.random.split(k_run, num_tasks)
    learned = protocol.run_fixed(family, "learned", learned_tx, theta, cfgs, keys, num_steps, eval_split=eval_split)
    adam = protocol.tune_learning_rate(family, "adam", optax.adam, lrs, cfgs, keys, num_steps, eval_split=eval_split,
                                       max_extensions=max_extensions)
    label = lambda r: "learned" if r["optimizer"] == "learned" else f"adam(lr={r['learning_rate']:g})"
    results = {}
    for r in [learned] + adam:
        finals = final_loss(r["losses"])
        results[label(r)] = {"final_train": float(np.mean(finals)), "final_train_median": float(np.median(finals)),
                             "eval": float(np.mean(r["evals"])), "curve": r["losses"].mean(0).tolist()}
    best_adam = best_runs(adam)["adam"]
    results["best_adam"] = None if best_adam.get("diverged") else label(best_adam)
    results["protocol"] = {"grid_edge": protocol.grid_edge(adam, "adam"),
                           "compare": None if best_adam.get("diverged") else protocol.compare_runs(learned, best_adam)}
    return results


def format_comparison(results: dict, num_steps: int) -> str:
    """A Markdown table of `compare_optimizers` results, the best Adam row marked.

    Args:
      results: `compare_optimizers` output.
      num_steps: the inner steps of the runs (shown in the header).

    Returns:
      the table: one row per optimizer with its final train loss (median over tasks, which picks
      the best Adam, and mean) and mean eval loss; below it, when Adam has a best rate, when the
      learned optimizer reaches that Adam's final train loss and the speedup
      (`outer_trainers.evaluation.protocol`), whether the best rate is still on the grid's edge, and a note
      when every Adam learning rate diverged (no best Adam).
    """
    lines = [f"| optimizer ({num_steps} inner steps) | final train loss, median | mean | eval loss, mean |",
             "|---|---|---|---|"]
    for name, r in results.items():
        if name in ("best_adam", "protocol"):
            continue
        mark = " (best Adam)" if name == results["best_adam"] else ""
        lines.append(f"| {name}{mark} | {r['final_train_median']:.4f} | {r['final_train']:.4f} | {r['eval']:.4f} |")
    proto = results.get("protocol") or {}
    compare = proto.get("compare")
    if results["best_adam"] is None:
        lines.append("\nNo best Adam: every learning rate of the grid diverged (a non-finite loss on some task).")
    elif compare is not None:
        if compare["diverged"]:
            lines.append("\nThe learned optimizer diverged (a non-finite loss on some task).")
        elif compare["steps_to_reach"] is not None:
            lines.append(f"\nThe learned optimizer reaches the best Adam's final train loss at step "
                         f"{compare['steps_to_reach']} of {num_steps} (speedup {compare['speedup']:.2f}x; "
                         f"median over tasks of the trailing mean over {max(1, num_steps // 10)} steps).")
        else:
            lines.append(f"\nThe learned optimizer does not reach the best Adam's final train loss within {num_steps} "
                         f"steps; Adam reaches the learned optimizer's at step {compare['baseline_steps_to_reach']} "
                         f"(speedup {compare['speedup']:.2f}x).")
    if proto.get("grid_edge") and results["best_adam"] is not None:
        lines.append(f"The best Adam rate is still on the {proto['grid_edge']} edge of the extended grid.")
    return "\n".join(lines)

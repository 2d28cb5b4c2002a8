"""Training sampled tasks with any optax optimizer, to compare learned optimizers with baselines.

    trainer = make_task_trainer(family, make_tx, num_steps)
    losses, evals = trainer(tx_args, cfgs, keys, family.data)

trains every task cfg (vmapped) for `num_steps` with `make_tx(tx_args)` (tx_args traced, so an
lr grid or a new theta reuses one compiled program) and returns per-step train losses
[num_tasks, num_steps] and the final loss on `eval_split` [num_tasks].
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from outer_trainers.train_model import eval_loss, init_train_state, train_step
from tasks.base import TaskFamily

MakeTx = Callable[[Any], optax.GradientTransformation]


def make_task_trainer(family: TaskFamily, make_tx: MakeTx, num_steps: int, *, eval_split: str = "test",
                      eval_batches: int = 8, normalize: bool = False):
    """A jitted fn(tx_args, cfgs, key, data) -> (train_losses [T, S], eval_losses [T]).

    Each task runs `train_model`'s `init_train_state` / `train_step` under `lax.scan`, vmapped over
    the T cfgs and keys; `tx_args` is traced (one compile for every lr or theta). With
    `normalize`, losses pass through each task's `normalizer` (comparable across tasks)."""

    def train_one(tx_args, cfg, key, data):
        task = family.task_fn(cfg)
        tx = make_tx(tx_args)
        k_init, k_train, k_eval = jax.random.split(key, 3)
        state = init_train_state(task, tx, k_init)
        state, losses = jax.lax.scan(lambda s, k: train_step(task, tx, s, data, k), state,
                                     jax.random.split(k_train, num_steps))
        final = eval_loss(task, state.params, state.model_state, data, k_eval, eval_split, eval_batches)
        if normalize:
            losses, final = task.normalizer(losses), task.normalizer(final)
        return losses, final

    return jax.jit(jax.vmap(train_one, in_axes=(None, 0, 0, None)))


def final_loss(losses) -> np.ndarray:
    """The "final" loss of training curves: the mean of the last 10% of steps, [..., T] -> [...]."""
    losses = np.asarray(losses)
    tail = max(1, losses.shape[-1] // 10)
    return np.mean(losses[..., -tail:], axis=-1)


def sample_cfgs(family: TaskFamily, key: jax.Array, num_tasks: int) -> Any:
    return jax.vmap(family.sample)(jax.random.split(key, num_tasks))


Setting = tuple[str, MakeTx, Sequence[tuple[float, Any]]]


def run_settings(family: TaskFamily, settings: Sequence[Setting], cfgs: Any, keys: jax.Array, num_steps: int, *,
                 eval_split: str = "test") -> list[dict]:
    """Trains the tasks `cfgs` (run keys `keys`, [T]) with every optimizer setting.

    settings: (name, make_tx, [(learning_rate, tx_args), ...]); each name compiles once, its
    tx_args traced (learning_rate is only a label: NaN where there is none, as for a theta).
    Returns [{"optimizer", "learning_rate", "losses" [T, num_steps], "evals" [T]}] (numpy),
    in the order of `settings`: every setting sees the same task draws and initialisations.
    """
    runs = []
    for name, make_tx, grid in settings:
        trainer = make_task_trainer(family, make_tx, num_steps, eval_split=eval_split)
        for lr, args in grid:
            losses, evals = jax.device_get(trainer(args, cfgs, keys, family.data))
            runs.append({"optimizer": name, "learning_rate": float(lr), "losses": np.asarray(losses),
                         "evals": np.asarray(evals)})
    return runs


def lr_grid(lrs: Sequence[float]) -> list[tuple[float, jax.Array]]:
    """[(lr, lr as a traced float32 argument)] for `run_settings`."""
    return [(float(lr), jnp.asarray(lr, jnp.float32)) for lr in lrs]


def compare_optimizers(family: TaskFamily, learned_tx: MakeTx, theta: Any, *, num_tasks: int, num_steps: int,
                       key: jax.Array, adam_lrs: Sequence[float] = (1e-3, 3e-3, 1e-2, 3e-2),
                       eval_split: str = "test") -> dict:
    """Learned optimizer vs Adam (each lr of the grid) on `num_tasks` held-out tasks of `family`.

    Returns {name: {"final_train": mean of the last 10% of train losses, "eval": mean eval loss,
    "curve": mean train loss per step}} for "learned" and "adam(lr=...)", plus "best_adam".
    """
    k_cfg, k_run = jax.random.split(key)
    cfgs = sample_cfgs(family, k_cfg, num_tasks)
    runs = run_settings(family, [("learned", learned_tx, [(float("nan"), theta)]), ("adam", optax.adam, lr_grid(adam_lrs))],
                        cfgs, jax.random.split(k_run, num_tasks), num_steps, eval_split=eval_split)
    results = {}
    for r in runs:
        name = "learned" if r["optimizer"] == "learned" else f"adam(lr={r['learning_rate']:g})"
        results[name] = {"final_train": float(np.mean(final_loss(r["losses"]))), "eval": float(np.mean(r["evals"])),
                         "curve": r["losses"].mean(0).tolist()}
    adam_names = [k for k in results if k.startswith("adam")]
    best = min(adam_names, key=lambda k: results[k]["final_train"] if np.isfinite(results[k]["final_train"]) else np.inf)
    results["best_adam"] = best
    return results


def format_comparison(results: dict, num_steps: int) -> str:
    """A Markdown table of `compare_optimizers` results."""
    lines = [f"| optimizer ({num_steps} inner steps) | final train loss | eval loss |", "|---|---|---|"]
    for name, r in results.items():
        if name == "best_adam":
            continue
        mark = " (best Adam)" if name == results["best_adam"] else ""
        lines.append(f"| {name}{mark} | {r['final_train']:.4f} | {r['eval']:.4f} |")
    return "\n".join(lines)

"""Time to target in wall-clock: each optimizer's seconds to reach tuned AdamW's final validation loss.

    s = step_seconds(family, make_tx, tx_args, cfgs, keys)        # one training step of one run, in seconds
    tt = time_to_target(best, target=median AdamW valids, seconds={name: s})

The rule and its honesty conditions are in `scores`' module docstring ("Time to target"): the step
at which the median over seeds of an optimizer's sparse validation curve first reaches the target,
times its measured wall time per training step (gradient, optimizer update and parameter update of
one unbatched run, validation excluded).
"""
from __future__ import annotations

import time
from typing import Any, Optional

import jax
import numpy as np

from outer_trainers.evaluation.scores import diverged, valid_steps_to_reach
from outer_trainers.evaluation.task_trainer import MakeTx
from outer_trainers.training.train_state import init_train_state, train_step
from tasks.base import TaskFamily, check_count

TIMED_STEPS, REPEATS = 20, 3


def step_seconds(family: TaskFamily, make_tx: MakeTx, tx_args: Any, cfgs: Any, keys: jax.Array, *,
                 num_steps: int = TIMED_STEPS, repeats: int = REPEATS) -> float:
    """The wall time of one training step of an optimizer on a task: the fastest of `repeats` timed scans.

    The first seed's task (`cfgs[0]`, `keys[0]`) is initialised, then a jitted `lax.scan` of
    `num_steps` `train_step`s is compiled and run once (warm-up) and timed `repeats` times from the
    same state, each waited for (`block_until_ready`); the result is the fastest over `num_steps`.

    Args:
      family: the task family.
      make_tx: tx_args -> the optax transform (a baseline at its rate, a learned optimizer's theta).
      tx_args: its argument.
      cfgs: task cfgs batched over seeds (`task_trainer.task_draws`); the first is timed.
      keys: run keys [S]; the first is used.
      num_steps: steps per timed scan (>= 1).
      repeats: timed scans (>= 1).

    Returns:
      seconds per step (> 0).
    """
    num_steps = check_count(num_steps, "step_seconds: num_steps")
    repeats = check_count(repeats, "step_seconds: repeats")
    cfg = jax.tree_util.tree_map(lambda x: x[0], cfgs)
    task = family.task_fn(cfg)
    k_init, k_train = jax.random.split(keys[0])

    @jax.jit
    def start(args):
        return init_train_state(task, make_tx(args), k_init)

    @jax.jit
    def steps(args, state, data):
        tx = make_tx(args)
        return jax.lax.scan(lambda s, k: train_step(task, tx, s, data, k), state,
                            jax.random.split(k_train, num_steps))[1]

    state = start(tx_args)
    jax.block_until_ready(steps(tx_args, state, family.data))
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(steps(tx_args, state, family.data))
        best = min(best, time.perf_counter() - t0)
    return max(best, 1e-12) / num_steps


def time_to_target(best: dict, target: Optional[float], seconds: dict) -> dict:
    """Each optimizer's steps and seconds to reach a validation loss (`scores`' module docstring).

    Args:
      best: `{name: its best run}` (`tuning.best_runs`), each with "valid_curve" and "valid_steps".
      target: the validation loss to reach (tuned AdamW's median final one), or None (no target:
        every entry None).
      seconds: `{name: seconds per step}` (`step_seconds`); a name missing gets no seconds.

    Returns:
      `{name: {"steps": the step t_k or None (never, diverged, no target), "step_seconds": s or
      None, "seconds": steps x s or None}}`.
    """
    out = {}
    for name, run in best.items():
        ok = target is not None and np.isfinite(target) and not run.get("diverged") and not diverged(run)
        steps = valid_steps_to_reach(run, target) if ok and "valid_curve" in run else None
        s = seconds.get(name)
        out[name] = {"steps": steps, "step_seconds": s,
                     "seconds": steps * s if steps is not None and s is not None else None}
    return out

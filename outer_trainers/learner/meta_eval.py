"""Meta-evaluation during outer training: held-out tasks trained with the current theta.

    ev = MetaEvaluator(learned_opt, [family_a, family_b], num_tasks=4, num_steps=200, seed=123)
    metrics = ev(theta)   # {"eval/<family>/final_loss": ..., "eval/<family>/mean_loss": ...,
                          #  "eval/<family>/eval_loss": ..., "eval/final_loss": mean over families, ...}

The held-out task cfgs and keys are drawn once from `seed` (independent of the training keys),
so successive evaluations differ only in theta. Losses are the tasks' normalised losses
(`task.normalizer`): final = mean of the last 10% of train losses, mean = mean over all steps,
eval = loss on `eval_split` after training. Each family compiles once: theta is a traced argument.
"""
from __future__ import annotations

from typing import Any, Sequence, Union

import jax
import numpy as np

from lopt.base import LearnedOptimizer
from outer_trainers.evaluation.scores import final_loss
from outer_trainers.evaluation.task_trainer import make_task_trainer, sample_cfgs
from tasks.base import Task, TaskFamily, single_task_family


def _as_family(t: Union[Task, TaskFamily]) -> TaskFamily:
    if isinstance(t, TaskFamily):
        return t
    if isinstance(t, Task):
        return single_task_family(t)
    raise TypeError(f"meta-evaluation tasks must be tasks.Task or tasks.TaskFamily, got {type(t).__name__}")


class MetaEvaluator:
    """Trains `num_tasks` held-out tasks of each family for `num_steps` steps with theta (see the module docstring).

    Args:
        learned_opt: the LearnedOptimizer whose theta is evaluated (run with `num_steps` as its horizon).
        tasks: a Task, a TaskFamily, or a list or tuple of them (a Task counts as a one-task family).
        num_tasks: held-out tasks drawn per family (>= 1).
        num_steps: inner training steps per task (>= 1).
        seed: seed of the held-out task configs and keys, fixed for the evaluator's life.
        eval_split: the data split of the after-training "eval_loss".
    """

    def __init__(self, learned_opt: LearnedOptimizer, tasks: Union[Task, TaskFamily, Sequence[Any]], *,
                 num_tasks: int = 4, num_steps: int = 100, seed: int = 12345, eval_split: str = "test"):
        if num_tasks < 1 or num_steps < 1:
            raise ValueError(f"num_tasks and num_steps must be >= 1, got {num_tasks}, {num_steps}")
        items = list(tasks) if isinstance(tasks, (list, tuple)) else [tasks]
        self.families = [_as_family(t) for t in items]
        if not self.families:
            raise ValueError("MetaEvaluator needs at least one task or task family")
        self.learned_opt, self.num_tasks, self.num_steps = learned_opt, int(num_tasks), int(num_steps)
        names = [f.name for f in self.families]
        self.names = [n if names.count(n) == 1 else f"{n}_{i}" for i, n in enumerate(names)]
        make_tx = lambda theta: learned_opt.opt_fn(theta, num_steps=self.num_steps)
        self._trainers = [make_task_trainer(f, make_tx, self.num_steps, eval_split=eval_split, normalize=True)
                          for f in self.families]
        self._inputs = []
        for i, f in enumerate(self.families):
            k_cfg, k_run = jax.random.split(jax.random.fold_in(jax.random.key(seed), i))
            self._inputs.append((sample_cfgs(f, k_cfg, self.num_tasks), jax.random.split(k_run, self.num_tasks)))

    def __call__(self, theta: Any) -> dict:
        """Trains the held-out tasks with `theta` and reports their normalised losses.

        Args:
            theta: the learned optimizer's meta-parameters.

        Returns:
            {name: float}: "eval/<family>/final_loss", ".../mean_loss" and ".../eval_loss" per family
            (averaged over its tasks), and "eval/final_loss", "eval/mean_loss", "eval/eval_loss"
            averaged over families.
        """
        out = {}
        totals = {"final_loss": [], "mean_loss": [], "eval_loss": []}
        for name, f, trainer, (cfgs, keys) in zip(self.names, self.families, self._trainers, self._inputs):
            losses, evals = jax.device_get(trainer(theta, cfgs, keys, f.data))
            losses, evals = np.asarray(losses, np.float64), np.asarray(evals, np.float64)
            vals = {"final_loss": float(np.mean(final_loss(losses))), "mean_loss": float(np.mean(losses)),
                    "eval_loss": float(np.mean(evals))}
            for k, v in vals.items():
                out[f"eval/{name}/{k}"] = v
                totals[k].append(v)
        for k, v in totals.items():
            out[f"eval/{k}"] = float(np.mean(v))
        return out

"""The tasks of an evaluation, built and checked before any training or file is written.

    plan = check_arguments(output_dir, specs, "heldout-cpu", (), 1000, 3, ["adam"], grids, 0.9, "test")
    for name, family, num_steps, seeds, eval_split in plan: ...
    plan = plan_tasks("validation-cpu", (), 1000, 3, "test", what="ValidationSelector")   # the tasks alone

A suite (`tasks.suites`) brings its tasks with their step budgets, seeds and eval splits; a list
of Tasks or TaskFamilies takes one step budget, seeds 0 .. num_seeds - 1 and one eval split. Every
argument of `suite_runs.evaluate` and `stress_test.stress_test` is checked here, and every suite
task's data loaded, so that a wrong argument or missing data stops the evaluation before any work.
`plan_tasks` builds the tasks alone, for other users of the same task lists (the validation
selection of meta-training, `learner.validation_selection`).
"""
from __future__ import annotations

import os
from typing import Any, NamedTuple, Optional, Sequence

from outer_trainers.evaluation.ablations import is_ablation, parse_ablation
from outer_trainers.evaluation.baselines.specs import SCHEDULE_CHOICES, parse_baseline
from outer_trainers.evaluation.optimizer_specs import PUBLISHED, untuned_baseline_names
from outer_trainers.evaluation.tuning import baseline_names, check_learning_rates
from tasks import suites
from tasks.base import Task, TaskFamily, check_count, single_task_family


class PlannedTask(NamedTuple):
    """One task of an evaluation.

    Attributes:
      name: the task's name in the results (unique within the plan).
      family: the task family its seeds draw from (a Task lifted by `single_task_family` draws
        the same task every seed).
      num_steps: training steps per run (also a learned optimizer's horizon).
      seeds: one task draw and run key per seed (`task_trainer.task_draws`).
      eval_split: the data split of the held-out loss after training.
    """
    name: str
    family: TaskFamily
    num_steps: int
    seeds: tuple
    eval_split: str


def check_arguments(output_dir: str, optimizers: Sequence[str], suite: Optional[str], tasks: Sequence[Any],
                    num_steps: int, num_seeds: int, baselines: Sequence[str], grids: dict, momentum: float,
                    eval_split: str, max_extensions: int = 4, *, valid_split: Optional[str] = None) -> list[PlannedTask]:
    """Checks an evaluation's arguments before any work, and builds its tasks (loading their data).

    Args:
      output_dir: where the results go (must not be an existing file).
      optimizers: the optimizer specs (at least one).
      suite: a suite name, or None (then `tasks`).
      tasks: Tasks or TaskFamilies (at least one without a suite; none with one).
      num_steps: training steps per run of `tasks` (>= 1).
      num_seeds: task draws per task of `tasks` (>= 1).
      baselines: baseline specs (each known: a tuned NAME[:SCHEDULE] or rules:NAME@BASELINE, or an untuned
        "published:NAME" or learned ablation, `ablations`).
      grids: {baseline: its learning-rate grid} (each used one non-empty, finite, > 0).
      momentum: SGD's momentum, in [0, 1).
      eval_split: a split of every task's data.
      max_extensions: >= 0.
      valid_split: the validation split tuning reads: a split of every task's data, not a task's
        eval split (None: none checked).

    Returns:
      `[PlannedTask(name, family, num_steps, seeds, eval_split)]`, one per task, in order.

    Raises:
      ValueError: a wrong argument or a suite task whose data is missing, naming it (and the
      command-line flag that sets it); TypeError: a task of another type.
    """
    check_count(num_steps, "evaluate: num_steps (--num_steps)")
    check_count(num_seeds, "evaluate: num_seeds (--num_seeds)")
    untuned = untuned_baseline_names()
    bad = {}
    for b in baselines:
        if b in untuned:
            continue
        try:
            parse_ablation(b) if is_ablation(b) else parse_baseline(b)
        except ValueError as e:
            bad[b] = f"no published optimizer {b!r}" if str(b).startswith(PUBLISHED) else str(e)
    if bad:
        raise ValueError(f"evaluate: unknown baselines {list(bad)} (--baselines): {'; '.join(bad.values())}; "
                         f"tuned baselines are NAME or NAME:SCHEDULE (NAME of {baseline_names()}, SCHEDULE of "
                         f"{list(SCHEDULE_CHOICES)}) or rules:NAME@BASELINE, untuned ones {untuned} and learned "
                         f"ablations pretrained:NAME-PART, untrained:NAME")
    for name, grid in grids.items():
        check_learning_rates(grid, f"evaluate: {name}_lrs")
    if not 0.0 <= momentum < 1.0:
        raise ValueError(f"evaluate: momentum must be in [0, 1), got {momentum!r}")
    if isinstance(max_extensions, bool) or not isinstance(max_extensions, int) or max_extensions < 0:
        raise ValueError(f"evaluate: max_extensions must be an integer >= 0, got {max_extensions!r}")
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise ValueError(f"evaluate: output_dir {output_dir} is a file, not a directory")
    if not optimizers:
        raise ValueError("evaluate: no optimizer to evaluate; give --optimizer (a theta file, pretrained:NAME or "
                         f"one of {baseline_names()})")
    if suite is not None and tasks:
        raise ValueError(f"evaluate: give a suite (--suite {suite}) or tasks (--task), not both")
    if suite is None and not tasks:
        raise ValueError("evaluate: no tasks; give --suite NAME (one of "
                         f"{suites.names()}) or --task 'QuadraticFamily(dim=4)' (or evaluate.tasks)")
    return plan_tasks(suite, tasks, num_steps, num_seeds, eval_split, valid_split=valid_split)


def plan_tasks(suite: Optional[str], tasks: Sequence[Any], num_steps: int, num_seeds: int, eval_split: str, *,
               what: str = "evaluate", valid_split: Optional[str] = None) -> list[PlannedTask]:
    """The tasks of a suite or of a task list, built (their data loaded) and checked.

    Args:
      suite: a suite name (`tasks.suites.names()`), or None (then `tasks`); its tasks bring their own
        step budgets, seeds and eval splits.
      tasks: Tasks or TaskFamilies (used without a suite), each run `num_steps` steps for seeds
        0 .. num_seeds - 1 and scored on `eval_split`; a repeated name gets its index appended.
      num_steps: training steps per run of `tasks`.
      num_seeds: task draws per task of `tasks`.
      eval_split: the data split of the held-out loss of `tasks`.
      what: the caller's name, starting every error message (e.g. "evaluate").
      valid_split: a validation split every task's data must have, other than its eval split (None: unchecked).

    Returns:
      `[PlannedTask(name, family, num_steps, seeds, eval_split)]`, one per task, in order.

    Raises:
      ValueError: an unknown suite, a suite task whose data is missing or an eval split a task's data
        does not have, naming it; TypeError: a task of another type.
    """
    if suite is not None:
        try:
            suite_tasks = suites.get(suite)
        except ValueError as e:
            raise ValueError(f"{what}: {e}") from None
        plan = []
        for t in suite_tasks:
            try:
                family = t.build()
            except FileNotFoundError as e:
                raise ValueError(f"{what}: suite {suite!r} task {t.name}: its data is missing: {e}") from None
            plan.append(PlannedTask(t.name, family, t.num_steps, tuple(t.seeds), t.eval_split))
    else:
        plan, seen = [], set()
        for t in tasks:
            family = single_task_family(t) if isinstance(t, Task) else t
            if not isinstance(family, TaskFamily):
                raise TypeError(f"{what}.tasks must hold Tasks or TaskFamilies, got {type(t).__name__}")
            name = family.name if family.name not in seen else f"{family.name}_{len(plan)}"
            seen.add(name)
            plan.append(PlannedTask(name, family, num_steps, tuple(range(num_seeds)), eval_split))
    for name, family, _, _, split in plan:
        if family.data is not None and split not in family.data.splits:
            raise ValueError(f"{what}: eval_split {split!r} is not a split of {name}'s data "
                             f"(it has {sorted(family.data.splits)})")
        if valid_split is not None and valid_split == split:
            raise ValueError(f"{what}: valid_split {valid_split!r} is {name}'s eval split; tuning on the data "
                             f"that scores the result would let test data into tuning: choose another split")
        if valid_split is not None and family.data is not None and valid_split not in family.data.splits:
            raise ValueError(f"{what}: valid_split {valid_split!r} is not a split of {name}'s data "
                             f"(it has {sorted(family.data.splits)}); give evaluate.valid_split one of them")
    return plan

"""Choosing theta on validation tasks during meta-training: `ValidationSelector`, the scores that pick `theta_best`.

    selector = ValidationSelector(learned_opt, "smoke", baseline="adam")     # or [Task, TaskFamily, ...]
    metrics = selector(theta, cache_path="run/validation_baseline.json")
    # {"valid/wins": 2, "valid/num_tasks": 3, "valid/iqm_ratio": 0.91, "valid/diverged": 0,
    #  "valid/score": 2.26, "valid/<task>/ratio": ..., "valid/seconds": ...}

The validation tasks (a suite of `tasks.suites`, or Tasks and TaskFamilies) are drawn as the
evaluation protocol draws them (`evaluation.task_trainer.task_draws`: seed s is one task draw and
one initialisation, the same for every optimizer). The tuned baseline is trained once, as
`evaluation.suite_runs.run_task` trains it for `scripts/evaluate.py`: every rate of its grid (at
least 7 rates) for every seed, the grid extended past an edge that holds the best rate, the best
rate picked by `tuning.best_runs` (lowest median over seeds of the final train loss; with
`objective="held_out"`, of the final validation loss, as `scripts/evaluate.py` tunes). Its best run
per task is cached as JSON under a key holding everything that determines it (the tasks' specs and
data digests, steps, seeds, eval split, the baseline, its grid and extensions); a cache whose key
differs is recomputed (with a warning) and replaced, never reused. Each call then trains the
learned optimizer (told each task's step budget) on the same draws, one compiled program per task
with theta traced, and scores it against the cached baseline. With f the final train loss
(`scores.final_loss`), L the learned optimizer and B the baseline at its best rate::

    wins       = #tasks with median_s f_L < median_s f_B        (scores.compare_runs' win_train)
    iqm_ratio  = IQM over tasks x seeds of f_L,s / f_B,s        (aggregate.iqm; inf for a diverged seed of L,
                                                                  0 on a task where every rate of B diverged)
    diverged   = #tasks on which a seed of L has a non-finite train or held-out loss (scores.diverged)
    score      = wins + 0.5 / (1 + iqm_ratio)   when diverged == 0, else -inf

so more wins always score higher, the IQM ratio breaks ties between equal wins (its term lies in
[0, 0.5]), and a theta with any diverged validation run is never selected.

With `objective="held_out"` f is instead each run's held-out loss after training (the task's eval
split, "test" for a suite task: `compare_runs`' win_eval and ratio_eval) and the baseline's rate is
chosen on its validation split, so theta_best is the theta that generalises best on the validation
tasks rather than the one that fits their training data best. (The validation tasks are not the
evaluation suites', so selecting on their test split leaves heldout-cpu untouched.)

In a run (`outer_train(validation=selector, validation_every=N)`, `train.validation_*`), every N
outer steps the run's result theta (`OuterTrainState.final_theta`: the moving average with
`theta_ema`) is scored; its metrics join that step's metrics.jsonl line, and when the score beats
the best so far (`improves`) the theta is written as theta_best.msgpack with its record
theta_best.json (`learner.theta_best`).
"""
from __future__ import annotations

import inspect
import json
import logging
import math
import os
import time
import warnings
from typing import Any, Optional, Sequence, Union

import jax
import numpy as np

from lopt.base import LearnedOptimizer
from outer_trainers.evaluation.aggregate import iqm
from outer_trainers.evaluation.report import json_safe, write_json
from outer_trainers.evaluation.scores import compare_runs, final_loss, loss_ratio
from outer_trainers.evaluation.suite_runs import run_task, runs_in_sequence
from outer_trainers.evaluation.task_plan import plan_tasks
from outer_trainers.evaluation.task_trainer import make_task_trainer, task_draws
from outer_trainers.evaluation.tuning import (ADAMW_WEIGHT_DECAY, baseline_names, best_runs, check_learning_rates,
                                              default_lrs, grid_edge, tune_learning_rate)
from outer_trainers.learner.validation_key import describe, digest, key_differences  # noqa: F401 (re-exported)
from outer_trainers.validation import check_int
from tasks import suites

logger = logging.getLogger("outer_trainers")
PREFIX = "valid/"
SCORE, BEST_SCORE = PREFIX + "score", PREFIX + "best_score"  # this validation's score, the best so far (logged)
VALIDATION_CACHE = "validation_baseline.json"  # the baseline's cache in a run's output directory
MIN_GRID_POINTS = 7  # the protocol's smallest learning-rate grid
MOMENTUM = 0.9  # the sgdm baseline's momentum (AdamW's weight decay: tuning.ADAMW_WEIGHT_DECAY)
DEFAULT_NUM_STEPS, DEFAULT_NUM_SEEDS = 100, 3  # for Tasks and TaskFamilies (a suite task has its own)
_CACHE_FORMAT = "lopt.validation_baseline"
OBJECTIVES = ("train", "held_out")  # what a selection compares: final train loss, or held-out loss after training


def selection_score(wins: int, iqm_ratio: float, num_diverged: int) -> float:
    """The selection score of the module docstring.

    score = wins + 0.5 / (1 + iqm_ratio) when no validation run diverged, else -inf.

    Args:
      wins: validation tasks won against the tuned baseline.
      iqm_ratio: the IQM over tasks x seeds of the final-loss ratios (>= 0, may be inf).
      num_diverged: tasks on which the learned optimizer diverged.

    Returns:
      the score (higher is better; -inf is never selected).
    """
    if num_diverged > 0:
        return -math.inf
    return float(wins) + 0.5 / (1.0 + float(iqm_ratio))


def improves(score: Optional[float], best: Optional[float]) -> bool:
    """Whether `score` is selectable (finite) and beats the best so far (strictly).

    Args:
      score: a `selection_score`.
      best: the best score so far, or None when there is none.

    Returns:
      True when theta_best should be replaced.
    """
    if score is None or not math.isfinite(score):
        return False
    return best is None or score > best


class ValidationSelector:
    """Scores theta on validation tasks against a tuned baseline (cached), for choosing `theta_best`.

    See the module docstring for the scores. Constructing it builds the tasks (loading their data)
    and checks every argument; nothing is trained or compiled until the first call.

    Args:
      learned_opt: the LearnedOptimizer whose theta is scored (told each task's step budget).
      tasks: a suite name of `tasks.suites` (e.g. "smoke", "validation-cpu"), a Task, a TaskFamily, or
        a list or tuple of Tasks and TaskFamilies.
      num_steps: inner steps of every validation run (None: a suite task's own budget, else
        `DEFAULT_NUM_STEPS`).
      num_seeds: seeds (task draws) 0 .. num_seeds - 1 per task (None: a suite task's own seeds, else
        `DEFAULT_NUM_SEEDS`).
      baseline: the tuned baseline (`tuning.baseline_names()`: "adam", "adamw", "muon", "sgdm").
      lrs: its starting learning-rate grid, at least `MIN_GRID_POINTS` rates (None: `tuning.default_lrs`).
      max_extensions: the most extensions of the grid past an edge holding the best rate (2 rates each).
      eval_split: the held-out split of Tasks and TaskFamilies (a suite task has its own).
      cache_path: the baseline's JSON cache (None: kept in memory only, unless a call names one).
      objective: what is compared, "train" (the final train loss; the baseline tuned on it) or
        "held_out" (the held-out loss after training; the baseline tuned on validation loss).

    Raises:
      ValueError: an unknown suite or baseline, a grid of fewer than 7 rates, no task, a bad count or
        missing data, naming the argument; TypeError: a task of another type.
    """

    def __init__(self, learned_opt: LearnedOptimizer, tasks: Union[str, Any, Sequence[Any]], *,
                 num_steps: Optional[int] = None, num_seeds: Optional[int] = None, baseline: str = "adam",
                 lrs: Optional[Sequence[float]] = None, max_extensions: int = 4, eval_split: str = "test",
                 cache_path: Optional[str] = None, objective: str = "train"):
        what = "ValidationSelector"
        if objective not in OBJECTIVES:
            raise ValueError(f"{what}: unknown objective {objective!r}; the objectives are {OBJECTIVES}")
        if not isinstance(learned_opt, LearnedOptimizer):
            raise TypeError(f"{what}: learned_opt must be a lopt.LearnedOptimizer, got {type(learned_opt).__name__}")
        if baseline not in baseline_names():
            raise ValueError(f"{what}: unknown baseline {baseline!r}; the baselines are {baseline_names()}")
        rates = sorted(check_learning_rates(default_lrs(baseline) if lrs is None else lrs, f"{what}: lrs"))
        if len(set(rates)) < MIN_GRID_POINTS:
            raise ValueError(f"{what}: lrs has {len(set(rates))} distinct rates ({rates}); the protocol tunes a "
                             f"baseline over at least {MIN_GRID_POINTS} (None gives {baseline}'s default grid "
                             f"{list(default_lrs(baseline))})")
        steps = None if num_steps is None else check_int(f"{what}: num_steps", num_steps, minimum=1)
        seeds = None if num_seeds is None else check_int(f"{what}: num_seeds", num_seeds, minimum=1)
        self.max_extensions = check_int(f"{what}: max_extensions", max_extensions, minimum=0)
        suite = tasks if isinstance(tasks, str) else None
        items = [] if suite else list(tasks) if isinstance(tasks, (list, tuple)) else [tasks]
        if suite is None and not items:
            raise ValueError(f"{what}: no validation task; give a suite name (one of {suites.names()}) or "
                             f"Tasks / TaskFamilies")
        plan = plan_tasks(suite, items, steps or DEFAULT_NUM_STEPS, seeds or DEFAULT_NUM_SEEDS, eval_split,
                          what=what)
        self.plan = [t._replace(num_steps=steps or t.num_steps,
                                seeds=tuple(range(seeds)) if seeds else t.seeds) for t in plan]
        self.suite_tasks = {t.name: t for t in suites.get(suite)} if suite else {}
        self.learned_opt, self.suite, self.baseline, self.lrs = learned_opt, suite, baseline, tuple(rates)
        self.cache_path, self.objective = cache_path, objective
        self._trainers, self._draws, self._key, self._baselines = None, None, None, None
        self.baseline_computations = 0  # how often the baseline was trained (not read from a cache)

    def config(self) -> dict:
        """The selection's settings, as the theta_best record states them.

        Returns:
          {"suite", "tasks": [{"name", "num_steps", "seeds", "eval_split"}], "baseline", "lrs", "max_extensions"}
          and "objective" when it is "held_out" (a "train" selection's settings, cache keys and theta_best
          records do not name it).
        """
        out = {"suite": self.suite, "baseline": self.baseline, "lrs": list(self.lrs),
               "max_extensions": self.max_extensions,
               "tasks": [{"name": t.name, "num_steps": t.num_steps, "seeds": list(t.seeds), "eval_split": t.eval_split}
                         for t in self.plan]}
        if self.objective != "train":
            out["objective"] = self.objective
        return out

    def cache_key(self) -> dict:
        """Everything that determines the baseline's results (computed once; the data are hashed).

        Returns:
          `config()` with each task's spec (`describe` of its family; a suite task's static config and
          options too) and the baseline's fixed settings (momentum, AdamW's weight decay, the rates per grid
          extension), JSON-normal.
        """
        if self._key is None:
            key = self.config()
            for entry, t in zip(key["tasks"], self.plan):
                entry["family"] = describe(t.family)
                if t.name in self.suite_tasks:
                    s = self.suite_tasks[t.name]
                    entry["suite_task"] = {"static_config": s.static_config(), "options": s.options}
            extend_by = inspect.signature(tune_learning_rate).parameters["extend_by"].default
            key.update(momentum=MOMENTUM, weight_decay=ADAMW_WEIGHT_DECAY, extend_by=extend_by)
            self._key = json.loads(json.dumps(json_safe(key), sort_keys=True))
        return self._key

    def key_digest(self) -> str:
        """The SHA-256 of `cache_key()` (JSON, sorted keys): what a theta_best record must match.

        Returns:
          the hex digest.
        """
        return digest(self.cache_key())

    def baselines(self, cache_path: Optional[str] = None) -> dict:
        """The tuned baseline's best run per task: read from the cache when its key matches, else trained.

        Args:
          cache_path: the JSON cache (None: `self.cache_path`; both None: memory only). A missing,
            unreadable or differently keyed cache is (re)computed and written there, atomically.

        Returns:
          {task name: {"losses" [S, T], "evals" [S] (float64), "best_lr", "lrs_tried", "grid_edge",
          "diverged"}}.
        """
        path = cache_path or self.cache_path
        if self._baselines is not None and self._baselines[0] == path:
            return self._baselines[1]
        doc = self.read_cache(path) if path else None
        if doc is None:
            known = self._baselines is not None  # trained or read already, for another path (or none)
            doc = self._baselines[2] if known else self._tune()
            if path:
                write_json(path, json_safe(doc))
        found = _best_runs(doc)
        self._baselines = (path, found, doc)
        return found

    def baseline_document(self) -> Optional[dict]:
        """The cache document of the baselines in use (read, handed in or trained), or None before any.

        Returns:
          {"format", "key", "tasks", "seconds"} as written to a cache, or None.
        """
        return None if self._baselines is None else self._baselines[2]

    def use_baselines(self, doc: dict) -> None:
        """Uses `doc`, a cache document of this selector's key read or trained elsewhere, as the baselines of
        calls that name no cache (e.g. in a Ray evaluation actor, whose learner owns the run's cache file).

        Args:
          doc: the document (`baseline_document()` or `read_cache(path)` of a selector with the same key).

        Raises:
          ValueError: the document's key is not this selector's (naming where they differ).
        """
        if doc.get("key") != self.cache_key():
            raise ValueError(f"the validation baselines handed in were tuned under another cache key (it differs in "
                             f"{', '.join(key_differences(doc.get('key'), self.cache_key()))})")
        self._baselines = (None, _best_runs(doc), doc)

    def read_cache(self, path: str) -> Optional[dict]:
        """The cached document at `path` when it exists, reads and has this key; None (warning why) otherwise.

        Args:
          path: the JSON cache.

        Returns:
          the document (null losses read as NaN), or None.
        """
        if not os.path.exists(path):
            return None
        try:
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
            if doc.get("format") != _CACHE_FORMAT:
                raise ValueError(f"not a {_CACHE_FORMAT} file")
        except (OSError, ValueError) as e:
            why = f"it is unreadable ({e})"
        else:
            if doc.get("key") == self.cache_key():
                return _nulls_to_nan(doc)
            why = f"its key differs ({', '.join(key_differences(doc.get('key'), self.cache_key()))})"
        msg = f"validation baseline cache {path}: {why}; training the {self.baseline} baseline again"
        logger.warning(msg)
        warnings.warn(msg, RuntimeWarning)
        return None

    def _tune(self) -> dict:
        """Trains the baseline over its grid on every task (`suite_runs.run_task`): the cache's document."""
        start, out = time.perf_counter(), {}
        by = "valid" if self.objective == "held_out" else "train"
        for t in self.plan:
            runs, _ = run_task(t.family, t.num_steps, t.seeds, [], [self.baseline], {self.baseline: self.lrs},
                               t.eval_split, momentum=MOMENTUM, weight_decay=ADAMW_WEIGHT_DECAY,
                               max_extensions=self.max_extensions, valid_points=1, select_by=by)
            best = best_runs(runs, by=by)[self.baseline]
            out[t.name] = {"best_lr": best["learning_rate"], "lrs_tried": [r["learning_rate"] for r in runs],
                           "grid_edge": grid_edge(runs, self.baseline, by=by), "diverged": bool(best.get("diverged", False)),
                           "median_final": float(np.median(final_loss(best["losses"]))),
                           "losses": best["losses"], "evals": best["evals"]}
        self.baseline_computations += 1
        return {"format": _CACHE_FORMAT, "key": self.cache_key(), "tasks": out,
                "seconds": time.perf_counter() - start}

    def runs(self, theta: Any) -> dict:
        """Trains every validation task's seeds with theta (one compiled program per task, theta traced).

        Args:
          theta: the learned optimizer's meta-parameters.

        Returns:
          {task name: run dict ("losses" [S, T], "evals" [S], float64)}.
        """
        if self._trainers is None:
            lo = self.learned_opt
            self._trainers = [make_task_trainer(t.family, lambda th, n=t.num_steps: lo.opt_fn(th, num_steps=n),
                                                t.num_steps, eval_split=t.eval_split,
                                                sequential=runs_in_sequence(t.family)) for t in self.plan]
            self._draws = [task_draws(t.family, t.seeds) for t in self.plan]
        out = {}
        for t, trainer, (cfgs, keys) in zip(self.plan, self._trainers, self._draws):
            losses, evals = jax.device_get(trainer(theta, cfgs, keys, t.family.data))
            out[t.name] = {"optimizer": "learned", "learning_rate": math.nan,
                           "losses": np.asarray(losses, np.float64), "evals": np.asarray(evals, np.float64)}
        return out

    def __call__(self, theta: Any, *, cache_path: Optional[str] = None) -> dict:
        """Scores theta on the validation tasks against the tuned baseline (module docstring).

        Args:
          theta: the learned optimizer's meta-parameters.
          cache_path: the baseline's cache (see `baselines`).

        Returns:
          {"valid/wins", "valid/num_tasks", "valid/iqm_ratio", "valid/diverged", "valid/score",
          "valid/<task>/ratio" (median-over-seeds ratio of the compared loss: `compare_runs`' ratio_train, or
          ratio_eval for the held-out objective),
          "valid/seconds" (of the learned runs)}: Python numbers.
        """
        base = self.baselines(cache_path)
        start = time.perf_counter()
        runs = self.runs(theta)
        held_out = self.objective == "held_out"
        compared = (lambda r: r["evals"]) if held_out else (lambda r: final_loss(r["losses"]))  # per seed
        out, ratios, wins, num_diverged = {}, [], 0, 0
        for name, run in runs.items():
            cmp = compare_runs(run, base[name])
            wins += int(cmp["win_eval"] if held_out else cmp["win_train"])
            num_diverged += int(cmp["diverged"])
            out[f"{PREFIX}{name}/ratio"] = float(cmp["ratio_eval"] if held_out else cmp["ratio_train"])
            ok = np.all(np.isfinite(run["losses"]), axis=-1) & np.isfinite(run["evals"])
            per_seed = 0.0 if cmp["baseline_diverged"] else loss_ratio(compared(run), compared(base[name]))
            ratios.extend(np.where(ok, per_seed, math.inf).tolist())
        ratio = iqm(ratios)
        out.update({f"{PREFIX}wins": wins, f"{PREFIX}num_tasks": len(runs), f"{PREFIX}iqm_ratio": ratio,
                    f"{PREFIX}diverged": num_diverged, SCORE: selection_score(wins, ratio, num_diverged),
                    f"{PREFIX}seconds": time.perf_counter() - start})
        return out


def _best_runs(doc: dict) -> dict:
    """{task name: the baseline's best run, losses and evals as float64 arrays} of a cache document."""
    return {name: dict(entry, losses=np.asarray(entry["losses"], np.float64),
                       evals=np.asarray(entry["evals"], np.float64)) for name, entry in doc["tasks"].items()}


def _nulls_to_nan(doc: dict) -> dict:
    """A cache document read back: the null entries of each task's losses and evals as NaN."""
    fix = lambda x: [fix(v) for v in x] if isinstance(x, list) else (math.nan if x is None else x)
    for entry in doc["tasks"].values():
        entry["losses"], entry["evals"] = fix(entry["losses"]), fix(entry["evals"])
    return doc

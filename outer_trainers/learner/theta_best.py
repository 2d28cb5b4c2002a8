"""A run's best theta on its validation tasks: theta_best.msgpack and its record theta_best.json.

    best = ThetaBest(output_dir, learned_opt, selector)      # when a run starts or resumes: reads the record
    ...
    metrics = best.record(step, state.final_theta, selector(state.final_theta), averaged=...)
    # every validation_every outer steps: + "valid/best_score"; an improvement writes the two files

`ThetaBest` is the selection both meta-training loops keep (`outer_train` in its process, the Ray
learner with the scores its evaluation actor returns): `best_score_on_disk` when it starts, and
`save_theta_best` when a score beats the best so far (`validation_selection.improves`).

`save_theta_best` writes the theta first (`lopt.save_theta`) and then its record (the outer step,
the validation metrics, the selection's settings, the baseline cache key and its SHA-256, the
theta file's SHA-256), each atomically; `outer_train` calls it before the step's checkpoint, so a
run resumed from an earlier checkpoint re-reaches every improvement it saved, with the same score
(validation is a pure function of theta), and a score equal to the record's does not rewrite it.
The best so far is the record's score, re-read when a run starts or resumes (`best_score_on_disk`):
a resume never replaces theta_best by a worse theta. A record selected under another cache key
(other validation tasks, steps, seeds or baseline) holds a score that is not comparable and is
refused, as is an unreadable record; a theta file that is not the one its record describes (a run
stopped between the two writes) is reported and replaced at the next improvement.
"""
from __future__ import annotations

import hashlib
import json
import os
import warnings
from typing import Any, Optional

from lopt.base import LearnedOptimizer
from lopt.serialization import save_theta
from outer_trainers.evaluation.report import json_safe, write_json
from outer_trainers.learner.validation_selection import (BEST_SCORE, PREFIX, SCORE, ValidationSelector, improves,
                                                         key_differences)
from outer_trainers.runs.run_checkpoints import THETA_BEST, THETA_BEST_RECORD

_RECORD_FORMAT = "lopt.theta_best"


def read_theta_best_record(output_dir: str) -> Optional[dict]:
    """The theta_best.json record of a run, or None when it has none.

    Args:
      output_dir: the run's directory.

    Returns:
      the record (see `save_theta_best`), or None.

    Raises:
      ValueError: the record exists but does not read as one (it is never replaced silently).
    """
    path = os.path.join(output_dir, THETA_BEST_RECORD)
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
        if record.get("format") != _RECORD_FORMAT or not isinstance(record.get("score"), (int, float)):
            raise ValueError(f"not a {_RECORD_FORMAT} record with a score")
    except (OSError, ValueError) as e:
        raise ValueError(f"{path} is unreadable ({e}); move it (and {THETA_BEST}) away to let the run select "
                         f"theta_best afresh") from None
    return record


def best_score_on_disk(output_dir: Optional[str], selector: ValidationSelector) -> Optional[float]:
    """The best score so far of a run's theta_best, re-read from its record when a run starts or resumes.

    Args:
      output_dir: the run's directory (None: no files, no best so far).
      selector: the run's ValidationSelector (the record must have its `key_digest`).

    Returns:
      the record's score, or None when there is no record.

    Raises:
      ValueError: the record is unreadable, or was selected with other validation tasks or another
        baseline (a score of another key is not comparable), naming both.
    """
    record = read_theta_best_record(output_dir) if output_dir else None
    if record is None:
        return None
    if record.get("cache_key_sha256") != selector.key_digest():
        changed = key_differences(record.get("cache_key"), selector.cache_key())
        raise ValueError(f"{os.path.join(output_dir, THETA_BEST_RECORD)} was selected on other validation tasks or "
                         f"another baseline (its cache key differs from this run's in {', '.join(changed)}), so its "
                         f"score is not comparable; use the same validation settings, or move {THETA_BEST} and "
                         f"{THETA_BEST_RECORD} away")
    theta_path = os.path.join(output_dir, THETA_BEST)
    if not os.path.exists(theta_path) or _file_sha256(theta_path) != record.get("theta_sha256"):
        warnings.warn(f"{theta_path} is missing or is not the theta its record {THETA_BEST_RECORD} describes (a run "
                      f"stopped between the two writes); it is replaced at the next improvement on the record's "
                      f"score {record['score']}", RuntimeWarning)
    return float(record["score"])


def _file_sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def save_theta_best(output_dir: str, learned_opt: LearnedOptimizer, theta: Any, *, step: int, metrics: dict,
                    selector: ValidationSelector, averaged: bool) -> dict:
    """Writes theta_best.msgpack (`lopt.save_theta`), then its record theta_best.json, each atomically.

    Args:
      output_dir: the run's directory.
      learned_opt: the run's learned optimizer.
      theta: the selected theta (the run's `final_theta` at `step`).
      step: the outer step it was scored at.
      metrics: its validation metrics (the selector's).
      selector: the run's ValidationSelector.
      averaged: whether theta is the moving average of theta (`theta_ema`).

    Returns:
      the record: {"format", "step", "score", "metrics", "validation", "cache_key", "cache_key_sha256",
      "theta", "theta_sha256"}.
    """
    theta_path = os.path.join(output_dir, THETA_BEST)
    save_theta(theta_path, learned_opt, theta)
    record = {"format": _RECORD_FORMAT, "step": int(step), "score": float(metrics[SCORE]),
              "metrics": {k: v for k, v in metrics.items() if k.startswith(PREFIX)},
              "validation": selector.config(), "cache_key": selector.cache_key(),
              "cache_key_sha256": selector.key_digest(),
              "theta": "final_theta: the moving average of theta (theta_ema)" if averaged else "theta",
              "theta_sha256": _file_sha256(theta_path)}
    write_json(os.path.join(output_dir, THETA_BEST_RECORD), json_safe(record))
    return record


class ThetaBest:
    """A run's theta_best selection as it goes: the best score so far, and the files of each improvement.

    Args:
      output_dir: the run's directory (None: no files; the best so far is kept in memory only).
      learned_opt: the run's learned optimizer (recorded with theta).
      selector: the run's ValidationSelector (its settings and cache key go into the record).
      read_record: start from the best score of the run's theta_best.json (`best_score_on_disk`); False for
        a new run that deletes the earlier run's results (`overwrite`).

    Raises:
      ValueError: the record is unreadable or was selected under another cache key (`best_score_on_disk`).
    """

    def __init__(self, output_dir: Optional[str], learned_opt: LearnedOptimizer, selector: ValidationSelector, *,
                 read_record: bool = True):
        self.output_dir, self.learned_opt, self.selector = output_dir, learned_opt, selector
        self.best: Optional[float] = best_score_on_disk(output_dir, selector) if read_record else None

    def record(self, step: int, theta: Any, metrics: dict, *, averaged: bool) -> dict:
        """Takes the validation of `theta` at outer step `step`; a score that beats the best so far
        (`improves`) writes theta_best.msgpack and theta_best.json (`save_theta_best`).

        Args:
          step: the outer step whose theta was validated.
          theta: that theta (the run's `final_theta` at `step`).
          metrics: the selector's metrics of theta.
          averaged: whether theta is the moving average of theta (`theta_ema`).

        Returns:
          `metrics` with "valid/best_score", the best score so far (this one included), once there is one.
        """
        improved = improves(metrics[SCORE], self.best)
        if improved:
            self.best = float(metrics[SCORE])
        out = dict(metrics, **({} if self.best is None else {BEST_SCORE: self.best}))
        if improved and self.output_dir is not None:
            save_theta_best(self.output_dir, self.learned_opt, theta, step=step, metrics=out, selector=self.selector,
                            averaged=averaged)
        return out

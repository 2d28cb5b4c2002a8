"""Finished tasks of an evaluation, kept on disk so that a stopped evaluation resumes where it stopped.

    store = TaskStore(output_dir, settings)        # settings: what makes two evaluations the same
    runs = store.load(name, task_settings)          # None: not finished before (or refused, see below)
    store.save(name, task_settings, {"runs": runs, ...})

An evaluation of a suite can take hours (tuning every baseline over its grid on every task); until
now a stopped machine lost every task it had finished. `evaluate` writes each task's runs to
`output_dir/finished_tasks/NAME.pkl` as soon as the task is done, and a later `evaluate` into the
same directory with the same settings reads them instead of training the task again. The record
holds a fingerprint of everything that decides the task's runs: the optimizer specs (a theta or
checkpoint file by the SHA-256 of its bytes; "pretrained:NAME" and "published:NAME" by name, as a
shipped name never changes its weights), the baselines and their tuning (grids, momentum, weight
decay, extensions), the validation split and resolution, whether steps are timed, and the task
itself (its name, `repr`, steps, seeds and eval split). A record whose fingerprint differs is never
silently mixed in: `load` raises, naming the task and the settings that differ, unless the
evaluation may overwrite (then the task is trained again and its record replaced).

A new optimizer is usually compared with the same tuned baselines as the last one, and tuning
them is most of an evaluation's cost. `baseline_runs` reads the tuned baselines' runs of a task
from another evaluation's records (`evaluate(..., baselines_from=DIR)`, `--baselines_from DIR`),
when everything but the optimizers under test matches; a task whose record differs, or is missing,
is tuned afresh, and the evaluation says which.

The records are Python pickles of plain dicts of numbers, strings and numpy arrays, written by
this module; like any pickle, load only records you wrote.
"""
from __future__ import annotations

import hashlib
import json
import os
import pickle
from typing import Optional

from lopt.file_io import atomic_write_bytes

FINISHED_DIR = "finished_tasks"
FORMAT = 1


def spec_identity(spec: str) -> str:
    """An optimizer spec as the fingerprint sees it: a file by the SHA-256 of its bytes, a name as it is."""
    if isinstance(spec, str) and os.path.isfile(spec):
        with open(spec, "rb") as f:
            return f"file sha256:{hashlib.sha256(f.read()).hexdigest()}"
    return str(spec)


class TaskStore:
    """One evaluation's finished tasks in `output_dir/finished_tasks/`.

    Args:
      output_dir: the evaluation's output directory.
      settings: the evaluation-wide settings (JSON-serialisable) that decide every task's runs.
      overwrite: replace a record whose settings differ instead of refusing it.
    """

    def __init__(self, output_dir: str, settings: dict, *, overwrite: bool = False):
        self.directory = os.path.join(output_dir, FINISHED_DIR)
        self.settings = settings
        self.overwrite = overwrite

    def path(self, name: str) -> str:
        """The record file of task `name` (path separators in the name replaced)."""
        safe = "".join(c if c.isalnum() or c in "-_.=()," else "_" for c in name)
        return os.path.join(self.directory, safe + ".pkl")

    def fingerprint(self, task_settings: dict) -> str:
        """The JSON text of the evaluation's and the task's settings (sorted keys): equal iff the runs would be."""
        return json.dumps({"format": FORMAT, "evaluation": self.settings, "task": task_settings},
                          sort_keys=True, default=repr)

    def load(self, name: str, task_settings: dict) -> Optional[dict]:
        """Task `name`'s saved record, or None when it has none (or a differing one that may be overwritten).

        Raises:
          ValueError: the record was made with other settings (and not `overwrite`), or cannot be read.
        """
        path = self.path(name)
        if not os.path.exists(path):
            return None
        try:
            record = _read_record(path)
        except ValueError as e:  # a truncated or foreign file: say which, never guess
            raise ValueError(f"evaluate: cannot read the finished task record {path} ({e}); "
                             f"delete it to train task {name!r} again") from None
        saved = record["fingerprint"]
        if saved == self.fingerprint(task_settings):
            return record["data"]
        if self.overwrite:
            return None
        raise ValueError(f"evaluate: {path} holds task {name!r} evaluated with other settings "
                         f"({_differences(saved, self.fingerprint(task_settings))}); choose another --output_dir "
                         f"or pass --overwrite to train it again")

    def baseline_runs(self, name: str, task_settings: dict, baselines) -> tuple[Optional[dict], str]:
        """The runs of `baselines` on task `name` that this store's record holds, for another evaluation.

        The record must have been made with the same settings as that evaluation (`self.settings` here
        being the other evaluation's) except for the optimizers under test; a "rules:" baseline also with
        the same rule chain ("rule_chains", `ablations.rule_chains`).

        Args:
          name: the task's name.
          task_settings: the other evaluation's settings of the task (steps, seeds, split, ...).
          baselines: the tuned baseline names wanted.

        Returns:
          ({baseline: its runs} for the baselines the record holds, "" or which it lacks), or (None, why
          not: no record, or other settings).
        """
        path = self.path(name)
        if not os.path.exists(path):
            return None, "no record"
        try:
            record = _read_record(path)
        except ValueError as e:
            return None, f"unreadable record ({e})"
        saved = json.loads(record["fingerprint"])
        current = json.loads(self.fingerprint(task_settings))
        chains = []
        for doc in (saved, current):
            doc["evaluation"].pop("optimizers", None)
            doc["evaluation"].pop("baselines", None)
            chains.append(doc["evaluation"].pop("rule_chains", {}))
        if saved != current:
            return None, f"other settings ({_differences(json.dumps(saved), json.dumps(current))})"
        runs = {b: [r for r in record["data"]["runs"] if r["optimizer"] == b] for b in baselines}
        other_chain = [b for b, own in runs.items() if own and chains[0].get(b) != chains[1].get(b)]
        runs = {b: ([] if b in other_chain else own) for b, own in runs.items()}
        missing = [b for b, own in runs.items() if not own and b not in other_chain]
        why = ([f"no runs of {', '.join(missing)}"] if missing else []) + (
            [f"{', '.join(other_chain)} ran with another rule chain (the record changed since)"] if other_chain else [])
        return ({b: own for b, own in runs.items() if own} or None), "; ".join(why)

    def save(self, name: str, task_settings: dict, data: dict) -> None:
        """Writes task `name`'s record atomically (`lopt.file_io.atomic_write_bytes`)."""
        record = {"fingerprint": self.fingerprint(task_settings), "data": data}
        atomic_write_bytes(self.path(name), pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL))


def _read_record(path: str) -> dict:
    """A record file's {"fingerprint", "data"}; ValueError naming the problem when it cannot be read."""
    try:
        with open(path, "rb") as f:
            record = pickle.load(f)
        if not (isinstance(record, dict) and isinstance(record.get("fingerprint"), str) and "data" in record):
            raise ValueError("not a finished task record")
        json.loads(record["fingerprint"])
        return record
    except Exception as e:
        raise ValueError(f"{type(e).__name__}: {e}") from None


def _differences(saved: str, current: str) -> str:
    """The top-level settings on which two fingerprints differ, e.g. "evaluation.baselines"."""
    try:
        a, b = json.loads(saved), json.loads(current)
    except ValueError:
        return "unreadable settings"
    keys = []
    for part in ("evaluation", "task"):
        x, y = a.get(part, {}), b.get(part, {})
        keys += [f"{part}.{k}" for k in sorted(set(x) | set(y)) if x.get(k) != y.get(k)]
    return ", ".join(keys) or "format"

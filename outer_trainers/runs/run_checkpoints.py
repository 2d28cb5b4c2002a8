"""The checkpoints of an outer-training run: restore-or-init, and the saves after each step.

    run = RunCheckpoints(output_dir, policy, run_metadata(learner, estimators, config))
    state, totals = run.restore_or_init(init, key)      # the newest matching checkpoint, or init(key)
    ...
    run.save(step, state, totals, logged_metrics, final=step == num_steps)

Checkpoints are written under `output_dir/checkpoints` (files and policy: see
outer_trainers.runs.checkpoint_manager). Each carries the run's metadata — what a checkpoint must match to
be resumed: the learned optimizer's architecture and config, the estimators, the run's length
("num_steps") and the caller's config — the run's RunTotals and its config history (the
extensions it went through). With `output_dir=None` there are none: `restore_or_init`
initialises and `save` does nothing. Nothing here runs a loop, so a learner fed by remote
workers checkpoints and resumes the same way as `outer_train`.

A run is trained further with `extend=True`: the resume may then change the length and what is
computed from it, and records the extension in the config history (`run_extension`, `config_history`).

Nothing is lost without being asked for: `restore_or_init` resumes from the newest readable
checkpoint (setting unreadable newer ones aside); it refuses (`UnreadableCheckpointsError`) when
there are checkpoints but none is readable, and refuses (`ExistingRunError`) a new run in a
directory that holds a run's results (`RUN_RESULTS`: metrics, TensorBoard files, checkpoints,
final, last and best theta), unless `overwrite=True`, which deletes those results (and only those) first. A
refused start (extensions included) changes nothing on disk; `check_start` tells what a start
would do without doing it.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import time
from typing import Any, Callable, Optional, Sequence, Union

import jax

import numpy as np

import lopt
from outer_trainers.runs.checkpoint_files import read
from outer_trainers.runs.checkpoint_manager import CheckpointManager
from outer_trainers.runs.checkpoint_policy import CheckpointPolicy
from outer_trainers.runs.corrupt_checkpoints import UnreadableCheckpointsError
from outer_trainers.runs.reporting import RunTotals
from outer_trainers.runs.run_extension import HISTORY_KEY, check_resume
from outer_trainers.runs.summaries import METRICS_FILE, TB_DIR

logger = logging.getLogger("outer_trainers")
CHECKPOINT_DIR = "checkpoints"
THETA_FINAL = "theta_final.msgpack"
THETA_LAST = "theta_last.msgpack"  # the last theta, beside theta_final (its moving average) when a run averages
# with validation selection (learner.validation_selection): the best-scoring theta so far and its record
THETA_BEST, THETA_BEST_RECORD = "theta_best.msgpack", "theta_best.json"
RUN_RESULTS = (METRICS_FILE, TB_DIR, CHECKPOINT_DIR, THETA_FINAL, THETA_LAST, THETA_BEST, THETA_BEST_RECORD)
OVERWRITE_ADVICE = ("pass overwrite=True (outer_train, train.overwrite, or --overwrite on scripts/outer_train.py) "
                    "to delete them and start a new run")


class ExistingRunError(ValueError):
    """A new run was asked for in a directory that holds another run's results, without `overwrite=True`."""


def config_history(output_dir: Optional[str], checkpoint_dir: Optional[str] = None) -> list[dict]:
    """The extensions a run went through, as its newest readable checkpoint records them.

    Args:
        output_dir: the run's directory.
        checkpoint_dir: its checkpoints, when not `output_dir`/checkpoints.

    Returns:
        [{"from_steps", "to_steps", "at_step", "time", "changed"}, ...] oldest first (see
        `run_extension`); [] for a run never extended, or without a readable checkpoint.
    """
    found = CheckpointManager(checkpoint_dir or os.path.join(output_dir, CHECKPOINT_DIR)).newest_readable()
    return list(found[1]["meta"].get(HISTORY_KEY, [])) if found is not None else []


def theta_from_checkpoint(path: str, which: str = "result") -> tuple[lopt.LearnedOptimizer, Any]:
    """The learned optimizer and theta stored in one of `outer_train`'s checkpoint files.

    For evaluating a run's intermediate checkpoints (`scripts/evaluate.py --optimizer
    RUN/checkpoints/ckpt_00001000.msgpack`) or saving one with `lopt.save_theta`. The checksum is
    verified first (`checkpoint_files.read`). By default it is the theta the run would have written
    as `theta_final.msgpack` at that step: the moving average of theta when the run kept one
    (`theta_ema`), else theta itself.

    Args:
        path: a checkpoint file written by `outer_train` or `ray_outer_train` (format v1 or v2).
        which: "result" (the average when the run kept one, else theta) or "last" (theta itself, what
            `theta_last.msgpack` holds).

    Returns:
        (the LearnedOptimizer of the run's "architecture" and "lopt_config", theta as numpy arrays
        in its `theta_spec` structure).

    Raises:
        ValueError: the file is unreadable or fails its checksum (`checkpoint_files.CorruptCheckpointError`,
            a ValueError), records no learned optimizer, or holds a theta that does not match the
            recorded architecture's structure and shapes.
    """
    if which not in ("result", "last"):
        raise ValueError(f"which must be 'result' or 'last', got {which!r}")
    payload = read(path)
    meta = payload.get("meta") or {}
    if "architecture" not in meta or "lopt_config" not in meta:
        raise ValueError(f"{path}: the checkpoint records no learned optimizer (no architecture/lopt_config in its "
                         f"metadata); was it written by outer_train?")
    learned_opt = lopt.architecture(meta["architecture"])(**meta["lopt_config"])
    spec = learned_opt.theta_spec()
    index = {entry[0]: i for i, entry in enumerate(payload["structure"])}
    averaged = which == "result" and any(entry[0].startswith(".learner_state.theta_avg") for entry in payload["structure"])
    prefix = ".learner_state.theta_avg" if averaged else ".learner_state.theta"
    leaves = []
    for path, leaf in jax.tree_util.tree_leaves_with_path(spec):
        want = jax.tree_util.keystr(path)
        name = prefix + want
        if name not in index:
            raise ValueError(f"{path}: no theta leaf {want} of {meta['architecture']} in the checkpoint")
        value = np.asarray(payload["leaves"][f"{index[name]:06d}"])
        if value.shape != tuple(leaf.shape):
            raise ValueError(f"{path}: theta leaf {want} has shape {value.shape}, {meta['architecture']} expects "
                             f"{tuple(leaf.shape)}")
        leaves.append(value)
    return learned_opt, jax.tree_util.tree_structure(spec).unflatten(leaves)


def theta_from_file(path: str) -> tuple[lopt.LearnedOptimizer, Any]:
    """The learned optimizer and theta in a theta file (`lopt.save_theta`) or an `outer_train` checkpoint file.

    Args:
        path: a theta file, or a checkpoint file (then its result theta, as `theta_from_checkpoint`).

    Returns:
        (the LearnedOptimizer, theta).

    Raises:
        ValueError: no such file, or it is neither a readable theta file nor a readable checkpoint
            (naming both reasons).
    """
    if not os.path.isfile(path):
        raise ValueError(f"{path!r}: no such file (a theta file or an outer_train checkpoint file)")
    try:
        return lopt.load_learned_optimizer(path)
    except Exception as theta_error:  # not a theta file: an outer_train checkpoint?
        try:
            return theta_from_checkpoint(path)
        except Exception as ckpt_error:
            raise ValueError(f"{path!r} is neither a theta file ({theta_error}) nor an outer_train checkpoint "
                             f"({ckpt_error})") from None


class RunCheckpoints:
    """Restores and saves the checkpoints of one run in `output_dir/checkpoints`.

    Args:
        output_dir: the run's directory; None keeps no checkpoints.
        policy: when to save (a CheckpointPolicy; default `CheckpointPolicy()`).
        meta: the run's metadata (`run_metadata`): stored in every checkpoint and required to match on restore;
            its "num_steps" (the run's length) may change only with `extend=True`.
        results: the names (files or directories) in `output_dir` that hold the run's results: a new run
            refuses to start over them, and `overwrite=True` deletes them (default `RUN_RESULTS`).
        checkpoint_dir: where the checkpoints go (default `output_dir/checkpoints`; None with no
            `output_dir`: no checkpoints).
        manager_factory: `manager_factory(directory, policy)` builds the CheckpointManager (default
            `CheckpointManager`; e.g. a manager that writes in a background thread).
        horizon_keys: metadata keys computed from "num_steps", which an extension may change with it.
        fixed_length: whether a resume to another "num_steps" needs `extend=True` (the training loop);
            False resumes to any length and records a change like an extension (meta-training).

    Attributes:
        history: the run's config history once `restore_or_init` ran (the checkpoint's, plus this
            session's extension), saved with every checkpoint.
        extension: this session's config-history entry, or None when it did not extend the run.
        resumed_meta: the metadata of the checkpoint `restore_or_init` resumed from, or None.
    """

    def __init__(self, output_dir: Optional[str], policy: Optional[CheckpointPolicy] = None,
                 meta: Optional[dict] = None, *, results: Sequence[str] = RUN_RESULTS,
                 checkpoint_dir: Optional[str] = None,
                 manager_factory: Callable[[str, CheckpointPolicy], CheckpointManager] = CheckpointManager,
                 horizon_keys: Sequence[str] = (), fixed_length: bool = True):
        self.output_dir = output_dir
        self.policy = policy or CheckpointPolicy()
        self.meta = dict(meta or {})
        self.results = tuple(results)
        self.horizon_keys, self.fixed_length = tuple(horizon_keys), fixed_length
        self.history: list[dict] = []
        self.extension: Optional[dict] = None
        self.resumed_meta: Optional[dict] = None
        self.manager = None
        if checkpoint_dir is None and output_dir is not None:
            checkpoint_dir = os.path.join(output_dir, CHECKPOINT_DIR)
        if checkpoint_dir is not None:
            self.manager = manager_factory(checkpoint_dir, self.policy)
            self.manager.mark_time(time.perf_counter())

    def newest_step(self) -> Optional[int]:
        """The step of the newest checkpoint file, readable or not.

        Returns:
            Its step, or None when there is no checkpoint (or no checkpoint directory).
        """
        found = self.manager.all() if self.manager is not None else []
        return found[0][0] if found else None

    def existing_results(self) -> list[str]:
        """What of a run's results `output_dir` holds.

        Returns:
            The names of `results` present in `output_dir` (directories only when not empty), sorted.
        """
        if self.output_dir is None:
            return []
        present = []
        for name in self.results:
            path = os.path.join(self.output_dir, name)
            if os.path.isdir(path) and not os.path.islink(path):
                if any(files for _, _, files in os.walk(path)):
                    present.append(name)
            elif os.path.lexists(path):
                present.append(name)
        return sorted(present)

    def clear_results(self) -> list[str]:
        """Deletes the run's results (`existing_results`) from `output_dir`, and nothing else there.

        Returns:
            The names deleted.
        """
        present = self.existing_results()
        for name in present:
            path = os.path.join(self.output_dir, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.remove(path)
        if present:
            logger.warning("overwrite: deleted the previous run's %s from %s", ", ".join(present), self.output_dir)
        if self.manager is not None:
            self.manager.rescan()  # forget the deleted run's best value
        return present

    def check_start(self, *, resume: bool = True, overwrite: bool = False, extend: bool = False) -> Optional[int]:
        """What `restore_or_init` would do with the same arguments, without doing it or changing anything on disk.

        Args:
            resume: continue from the newest readable checkpoint (see `restore_or_init`).
            overwrite: start a new run, deleting the previous run's results (see `restore_or_init`).
            extend: the resumed run may continue to another length (see `restore_or_init`).

        Returns:
            The step of the checkpoint it would resume from, or None for a new run.

        Raises:
            UnreadableCheckpointsError: `resume` and there are checkpoints, but none is readable.
            ValueError: the checkpoint it would resume from was written by another run (metadata differs;
                without `extend` and with `fixed_length`, a different num_steps too), `extend` asks for
                fewer steps than it has taken, or `extend` is combined with `overwrite` or `resume=False`.
            ExistingRunError: a new run would start over results in `output_dir` without `overwrite`.
        """
        found = self._start(resume, overwrite, extend)
        return None if found is None else found[1]["step"]

    def _start(self, resume: bool, overwrite: bool, extend: bool) -> Optional[tuple[str, dict, Optional[dict]]]:
        """`check_start`'s decision: None for a new run, else (path, payload, extension entry or None)."""
        if extend and (overwrite or not resume):
            raise ValueError("extend=True trains an existing run further: it cannot be combined with "
                             f"{'overwrite=True' if overwrite else 'resume=False'}, which start a new run")
        if self.manager is None or overwrite:
            return None
        if resume:
            try:
                found = self.manager.newest_readable()
            except UnreadableCheckpointsError as e:
                raise UnreadableCheckpointsError(e.directory, e.unreadable, advice=(
                    f"Move them away (or restore good copies) to resume, use another output_dir, or "
                    f"{OVERWRITE_ADVICE}.")) from None
            if found is not None:
                path, payload, _ = found
                entry = check_resume(path, payload["meta"], self.meta, payload["step"], extend=extend,
                                     horizon_keys=self.horizon_keys, fixed_length=self.fixed_length)
                return path, payload, entry
        present = self.existing_results()
        if present:
            why = "resume=False asks for a new run" if resume is False else "it has no checkpoint to resume from"
            raise ExistingRunError(f"{self.output_dir} holds the results of a run ({', '.join(present)}) and {why}; "
                                   f"a new run there would overwrite them. Use another output_dir, or "
                                   f"{OVERWRITE_ADVICE}.")
        return None

    def restore_or_init(self, init: Callable[[jax.Array], Any], key: jax.Array, *, resume: bool = True,
                        overwrite: bool = False, extend: bool = False,
                        structure_at: Optional[Callable[[int], Any]] = None,
                        structure_for: Optional[Callable[[int, dict], Any]] = None) -> tuple[Any, RunTotals]:
        """The state and totals of the newest readable checkpoint, or `init(key)` and zero totals.

        A checkpoint that reads but does not match the metadata or the state's structure raises
        ValueError (it is never skipped); unreadable ones are skipped and, once a good one is
        restored, set aside to `checkpoints/corrupt/` with a warning. When there are checkpoints but
        none is readable it raises `UnreadableCheckpointsError`; a new run (no checkpoint, or
        `resume=False`) where `output_dir` holds results raises `ExistingRunError`. Either refusal
        changes nothing on disk; `overwrite=True` starts a new run instead, deleting the results first.
        A checkpoint whose "num_steps" differs is resumed only with `extend=True` or without
        `fixed_length` (`run_extension.check_resume`); the extension is recorded in `history` (saved
        from the next checkpoint on) and `extension`; the state is returned as the checkpoint holds it.

        Args:
            init: `init(key) -> state`, the initial state of a new run.
            key: the run's PRNG key, for `init`.
            resume: continue from the newest readable checkpoint; False starts a new run (refused where
                `output_dir` holds results, unless `overwrite`).
            overwrite: start a new run whatever `output_dir` holds, deleting the previous run's results
                (`results`: its checkpoints included) first; implies not resuming.
            extend: a resumed run may continue to another "num_steps" (at least the steps it has taken).
            structure_at: `structure_at(step)` -> the structure (e.g. via `jax.eval_shape`) of the state a
                checkpoint written at `step` holds, for runs whose state changes structure over time (an
                EstimatorSchedule); default: that of `init(key)`.
            structure_for: `structure_for(step, meta)` -> the same from the checkpoint's step and metadata, for
                states whose shapes follow the run's length (e.g. per-step histories); overrides `structure_at`.

        Returns:
            (state, totals).
        """
        found = self._start(resume, overwrite, extend)
        self.history, self.extension, self.resumed_meta = [], None, None
        if found is None:
            if overwrite:
                self.clear_results()
            return init(key), RunTotals()
        path, saved, entry = found[0], found[1]["meta"], found[2]
        if structure_for is not None:
            template = lambda step: structure_for(step, saved)
        else:
            template = structure_at if structure_at is not None else (lambda _: jax.eval_shape(init, key))
        state, payload = self.manager.restore_latest(template)  # the metadata was checked by _start
        if payload["meta"] != saved:
            raise RuntimeError(f"{path} changed while the run was resuming from it; nothing was restored")
        self.resumed_meta = saved
        self.history = list(saved.get(HISTORY_KEY, [])) + ([entry] if entry is not None else [])
        self.extension = entry
        if entry is not None:
            logger.info("extending the run in %s from num_steps=%s to %s at step %d%s", self.manager.directory,
                           entry["from_steps"], entry["to_steps"], entry["at_step"],
                           f" ({'; '.join(entry['changed'])})" if entry["changed"] else "")
        logger.info("resuming from step %d (%s)", payload["step"], self.manager.directory)
        return state, RunTotals.from_meta(payload["meta"])
    def save(self, step: int, state: Any, totals: RunTotals, metrics: Optional[dict] = None, *,
             final: bool = False) -> None:
        """Saves the checkpoints the policy wants after outer step `step`.

        Rolling and permanent checkpoints as `CheckpointManager.due` says; a "best" one when
        `metrics` holds `policy.best_metric` and it improves on the best so far.

        Args:
            step: outer steps taken.
            state: the state to save.
            totals: the run's totals now (stored with the metadata).
            metrics: this step's logged metrics, or None when the step was not logged.
            final: whether this is the session's last step (`policy.save_final` saves then).
        """
        if self.manager is None:
            return
        now = time.perf_counter()
        meta = dict(self.meta, **totals.as_meta())
        if self.history:
            meta[HISTORY_KEY] = self.history
        self.manager.save(step, state, meta, kinds=self.manager.due(step, now, final=final), now=now)
        best = self.policy.best_metric
        if metrics is not None and best and best in metrics:
            self.manager.save_best(step, state, metrics[best], meta)

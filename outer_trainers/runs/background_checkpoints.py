"""Checkpoint writes that do not stall training: host copies, written by a background thread.

    mgr = BackgroundCheckpointManager(directory, policy)
    mgr.save(step, state, meta, kinds=mgr.due(step, now), now=now)   # returns once the state is on the host
    ...                                                               # training goes on while it is written
    mgr.wait()                                                        # the writes are on disk (re-raises errors)
    mgr.close()

As the big_vision loop does with its thread pool: `save` copies the state to host memory
(`host_copy`, so later steps cannot change what is written), hands the serialisation and the
atomic write (`CheckpointManager.save`) to one background thread, and returns. Writes happen in
submission order; before a new step's write is queued, the previous step's is waited for, so at
most one step's host copy is held beside the training state. Files, layout and policy are those
of `outer_trainers.runs.checkpoint_manager`; a kill mid-write leaves a `.tmp-*` file that is never read.
"""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Optional, Sequence

import jax
import numpy as np

from outer_trainers.runs.checkpoint_manager import CheckpointManager
from outer_trainers.runs.checkpoint_policy import CheckpointPolicy


def host_copy(state: Any) -> Any:
    """A copy of `state` in host memory that later changes to `state` cannot reach.

    Args:
        state: a pytree of jax arrays (typed PRNG keys included) and numpy arrays.

    Returns:
        The same structure: jax arrays fetched to numpy (typed PRNG keys stay jax arrays, which are
        immutable) and numpy leaves copied.
    """
    fetched = jax.device_get(state)
    return jax.tree_util.tree_map(lambda x, h: np.array(h) if isinstance(x, np.ndarray) else h, state, fetched)


class BackgroundCheckpointManager(CheckpointManager):
    """A CheckpointManager whose `save` and `save_best` write from host copies in a background thread.

    Args:
        directory: where the checkpoints go (created on the first save).
        policy: when to save and how many to keep (default `CheckpointPolicy()`).
    """

    def __init__(self, directory: str, policy: Optional[CheckpointPolicy] = None):
        super().__init__(directory, policy)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lopt-checkpoint")
        self._pending: list[tuple[int, Future]] = []
        self.last_save_step: Optional[int] = None

    def wait(self, before_step: Optional[int] = None) -> None:
        """Blocks until the queued writes are on disk, re-raising the first write error.

        Args:
            before_step: wait only for the writes of steps before this one (None: all).
        """
        done = [(s, f) for s, f in self._pending if before_step is None or s < before_step]
        self._pending = [p for p in self._pending if p not in done]
        for _, future in done:
            future.result()

    def save(self, step: int, state: Any, meta: Optional[dict] = None, kinds: Sequence[str] = ("rolling",),
             now: Optional[float] = None) -> list[str]:
        """Queues the checkpoint once per kind in `kinds` (see `CheckpointManager.save`) and returns.

        Args:
            step: the step the state is at (it names the file).
            state: any pytree of arrays; copied to the host before this returns.
            meta: JSON-able metadata stored with it.
            kinds: "rolling" and/or "permanent"; empty writes nothing.
            now: the current time; a rolling save at a given `now` restarts the every_seconds clock (at once).

        Returns:
            The paths that will be written.
        """
        if not kinds:
            return []
        self.wait(before_step=step)
        host = host_copy(state)
        if "rolling" in kinds and now is not None:
            self.mark_time(now)
        self._pending.append((step, self._pool.submit(super().save, step, host, meta, tuple(kinds), None)))
        self.last_save_step = step
        return [self.path(kind, step) for kind in kinds]

    def save_best(self, step: int, state: Any, value: float, meta: Optional[dict] = None) -> Optional[str]:
        """Queues a "best" checkpoint if `value` beats the best so far (see `CheckpointManager.save_best`).

        Args:
            step: the step the state is at.
            state: any pytree of arrays; copied to the host before this returns.
            value: this step's value of `policy.best_metric`.
            meta: JSON-able metadata stored with it.

        Returns:
            The path that will be written, or None when `value` is not better.
        """
        self.wait(before_step=step)  # earlier best writes set best_value
        if not self.is_better(value):
            return None
        host = host_copy(state)
        self._pending.append((step, self._pool.submit(super().save_best, step, host, value, meta)))
        self.last_save_step = step
        return self.path("best", step)

    def close(self) -> None:
        """Waits for the queued writes and stops the thread (re-raising a write error)."""
        try:
            self.wait()
        finally:
            self._pool.shutdown(wait=True)

"""When a run saves checkpoints, and how many it keeps: `CheckpointPolicy`.

    policy = CheckpointPolicy(every_steps=100, every_seconds=600, keep=3, checkpoints_at=(1000,),
                              best_metric="eval/final_loss", best_mode="min")
    policy.kinds_due(step, seconds_since_save=elapsed)   # e.g. ["permanent", "rolling"]

Three kinds of checkpoint: rolling (by steps or by time; the last `keep` kept), permanent (at
given steps or every M steps; never deleted) and best (whenever a logged metric improves; the
`keep_best` best kept). A policy is a frozen, hashable value; `CheckpointManager` applies it.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional, Sequence


@dataclasses.dataclass(frozen=True)
class CheckpointPolicy:
    """When to save checkpoints, of three kinds: rolling (the last `keep` kept), permanent (never
    deleted) and best (the `keep_best` best by a logged metric).

    Attributes:
        every_steps: a rolling checkpoint every this many steps (None: not by steps).
        every_seconds: a rolling checkpoint when this many seconds passed since the last one (None: not by time).
        keep: rolling checkpoints kept (>= 1); older ones are deleted.
        checkpoints_at: steps that get a permanent checkpoint.
        permanent_every: a permanent checkpoint every this many steps (None: none).
        best_metric: a logged metric name (e.g. "eval/final_loss"); a best checkpoint whenever it improves
            (None: no best checkpoints).
        best_mode: "min" or "max": whether lower or higher `best_metric` is better.
        keep_best: best checkpoints kept (>= 1).
        save_final: a rolling checkpoint at the last step, so re-running a finished run does nothing.
    """

    every_steps: Optional[int] = None
    every_seconds: Optional[float] = 600.0
    keep: int = 3
    checkpoints_at: Sequence[int] = ()
    permanent_every: Optional[int] = None
    best_metric: Optional[str] = None
    best_mode: str = "min"
    keep_best: int = 1
    save_final: bool = True

    def __post_init__(self):
        if self.keep < 1 or self.keep_best < 1:
            raise ValueError(f"keep and keep_best must be >= 1, got {self.keep}, {self.keep_best}")
        if self.best_mode not in ("min", "max"):
            raise ValueError(f"best_mode must be 'min' or 'max', got {self.best_mode!r}")
        for name in ("every_steps", "permanent_every"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise ValueError(f"{name} must be >= 1 or None, got {v}")
        object.__setattr__(self, "checkpoints_at", tuple(int(s) for s in self.checkpoints_at))

    def kinds_due(self, step: int, *, seconds_since_save: Optional[float] = None, final: bool = False) -> list[str]:
        """Which checkpoints this policy wants after `step`.

        Args:
            step: steps taken.
            seconds_since_save: seconds since the last rolling save (or since training started or
                resumed); None: the clock has not started, so nothing is due by time.
            final: whether `step` is the last step (for `save_final`).

        Returns:
            A list with "permanent" and/or "rolling", possibly empty.
        """
        kinds = []
        if step in self.checkpoints_at or (self.permanent_every and step % self.permanent_every == 0):
            kinds.append("permanent")
        by_steps = self.every_steps is not None and step % self.every_steps == 0
        by_time = (self.every_seconds is not None and seconds_since_save is not None
                   and seconds_since_save >= self.every_seconds)
        if by_steps or by_time or (final and self.save_final):
            kinds.append("rolling")
        return kinds

    def better(self, value: float, than: Optional[float]) -> bool:
        """Whether `value` of `best_metric` is finite and beats `than` (per `best_mode`).

        Args:
            value: a value of the best metric (None or non-finite is never better).
            than: the best value so far, or None when there is none.

        Returns:
            True when a best checkpoint should be saved for `value`.
        """
        if value is None or not math.isfinite(float(value)):
            return False
        if than is None:
            return True
        return value < than if self.best_mode == "min" else value > than

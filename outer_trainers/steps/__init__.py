"""Unrolled systems: what one step of an inner problem is, and how long a truncation lasts.

`truncated_step` (the `TruncatedStep` interface, written for one particle), `lopt_truncated_step`
(a learned optimizer training a task), `truncation_schedule` (unroll lengths), `unroll` (the
lax.scan over steps and the vmap over particles that estimators share).
"""
from outer_trainers.steps.lopt_truncated_step import LOptInnerState, LOptTruncatedStep
from outer_trainers.steps.truncated_step import StepOut, TruncatedStep
from outer_trainers.steps.truncation_schedule import (ConstantTruncationSchedule, LogUniformTruncationSchedule,
                                                      NeverEndingTruncationSchedule, PowerLawTruncationSchedule,
                                                      TruncationSchedule, TruncationState)

__all__ = ["TruncatedStep", "StepOut", "LOptTruncatedStep", "LOptInnerState", "TruncationSchedule", "TruncationState",
           "ConstantTruncationSchedule", "LogUniformTruncationSchedule", "NeverEndingTruncationSchedule",
           "PowerLawTruncationSchedule"]

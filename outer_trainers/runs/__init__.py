"""Run files: what a run writes to its output directory and reads back on resume.

`checkpoints` (checksummed checkpoint files and their manager), `background_checkpoints` (writing
them off the training thread), `run_checkpoints` (a run's directory policy and resume),
`reporting` (progress lines and divergence), `summaries` (metrics.jsonl and TensorBoard events).
"""
from outer_trainers.runs.checkpoints import CheckpointManager, CheckpointPolicy, UnreadableCheckpointsError
from outer_trainers.runs.reporting import MetaTrainingDiverged, Reporter, RunTotals
from outer_trainers.runs.run_checkpoints import ExistingRunError, RunCheckpoints, theta_from_checkpoint

__all__ = ["CheckpointManager", "CheckpointPolicy", "UnreadableCheckpointsError", "MetaTrainingDiverged", "Reporter",
           "RunTotals", "ExistingRunError", "RunCheckpoints", "theta_from_checkpoint"]

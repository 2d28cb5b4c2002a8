"""Run files: what a run writes to its output directory and reads back on resume.

`checkpoint_files` (one checksummed checkpoint file: bytes, read, restore), `checkpoint_policy`
(when to save, how many to keep), `checkpoint_manager` (a directory of checkpoints: save, prune,
find, restore), `corrupt_checkpoints` (unreadable files skipped and set aside),
`background_checkpoints` (writing them off the training thread), `run_checkpoints` (a run's
directory: resume or start, refusing to replace another run's results), `run_extension` (training
a run further: what may change, the config history), `reporting` (progress lines and
divergence), `summaries` (metrics.jsonl and TensorBoard events).
"""
from outer_trainers.runs.checkpoint_files import CorruptCheckpointError, read, restore, structure_of, to_bytes
from outer_trainers.runs.checkpoint_manager import CheckpointManager
from outer_trainers.runs.checkpoint_policy import CheckpointPolicy
from outer_trainers.runs.corrupt_checkpoints import UnreadableCheckpointsError
from outer_trainers.runs.reporting import MetaTrainingDiverged, Reporter, RunTotals
from outer_trainers.runs.run_checkpoints import ExistingRunError, RunCheckpoints, config_history, theta_from_checkpoint, \
    theta_from_file

__all__ = ["CheckpointManager", "CheckpointPolicy", "UnreadableCheckpointsError", "CorruptCheckpointError", "read",
           "restore", "structure_of", "to_bytes", "MetaTrainingDiverged", "Reporter", "RunTotals", "ExistingRunError",
           "RunCheckpoints", "theta_from_checkpoint", "theta_from_file", "config_history"]

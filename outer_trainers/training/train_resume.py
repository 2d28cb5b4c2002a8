"""What a training run checkpoints, and how it resumes and is extended to more steps.

    run = training_checkpoints(setup)                       # the run's RunCheckpoints (nothing read yet)
    step = check_training_start(setup)                      # what a start would do; reads, writes nothing
    tree = initial_tree(setup, key)                         # {"state": TrainState, "history": {...}}
    placement = state_shardings(setup)                      # where each TrainState leaf lives (sharded runs)

The checkpointed tree is the TrainState and the run's histories: "train" (loss and grad norm of
every step: float32 [num_steps]) and "eval" (one value per evaluation step: float32 [E]), NaN
where nothing ran yet. Its metadata (`TrainingSetup.checkpoint_meta`) holds the length
("num_steps") and the evaluation steps ("eval_steps"), both computed from num_steps.

Extending a run (`extend=True`; `runs.run_extension` says what may change and records it) from
N₀ to N steps at step a (the checkpoint's step, a ≤ N):

- the TrainState (params, optimizer state, EMA, step, key) continues as it is: the steps after a
  are those an uninterrupted run would take with the optimizer given now;
- the optimizer is the caller's transform: pass the one built for the new horizon. Its state
  stores no horizon (optax schedules keep a step count, learned optimizers an iteration), so for
  the steps t > a a schedule over N (`optax.cosine_decay_schedule(lr, decay_steps=N)`, a learned
  optimizer's `opt_fn(theta, num_steps=N)` progress features min(t/N, 1)) gives the new horizon's
  value at t, and the steps ≤ a keep the values they had under N₀. A schedule that had decayed
  to its end at a = N₀ therefore steps back up to the new schedule's value at a: a cosine decay
  to 0 over 40 steps, extended to 60, gives step 41 the rate lr · (1 + cos(π · 40/60)) / 2 = lr/4.
  The optimizer passed decides: built for N₀ still, it runs past its horizon (a decayed schedule
  stays at its end value, a learned optimizer's progress features at min(t/N₀, 1) = 1). With a
  horizon-free optimizer (a constant learning rate, Adam) the extended run equals a run started
  with N steps, bit for bit;
- the evaluation steps are the new run's (`evaluation_steps(N, eval_every, eval_at)`): the values
  of those at or before a come from the checkpoint, the others are evaluated as they come; an
  evaluation the old run made only because a = N₀ was its last step stays in metrics.jsonl but is
  not in the extended result (`extended_history`);
- the loss and grad-norm histories grow to N steps (NaN past a until trained).

A run with a `ParamSharding` (`train_sharding`) writes whole arrays (each leaf gathered to the
host) and splits the restored state over its mesh again (`state_shardings`), so it resumes on
any mesh, or on one device.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import jax
import numpy as np

from outer_trainers.runs.checkpoint_manager import CheckpointManager
from outer_trainers.runs.checkpoint_policy import CheckpointPolicy
from outer_trainers.runs.run_checkpoints import CHECKPOINT_DIR, RunCheckpoints
from outer_trainers.runs.summaries import METRICS_FILE, TB_DIR
from outer_trainers.training.train_setup import TRAIN_KEYS, TrainingSetup
from outer_trainers.training.train_state import init_train_state

TRAIN_RESULTS = (METRICS_FILE, TB_DIR, CHECKPOINT_DIR)  # what a run leaves in output_dir (never silently replaced)
HORIZON_KEYS = ("eval_steps",)  # metadata computed from num_steps, which an extension changes with it


def initial_tree(setup: TrainingSetup, key: jax.Array, num_steps: Optional[int] = None,
                 num_evals: Optional[int] = None) -> dict:
    """A new run's checkpointed tree: the initial TrainState and empty (NaN) histories.

    Args:
        setup: the run.
        key: the key of the initial TrainState (`setup.init_key` for the run's own).
        num_steps: the length of the train histories (default `setup.num_steps`).
        num_evals: the length of the evaluation histories (default `len(setup.eval_steps)`).

    Returns:
        {"state": TrainState, "history": {"train": {k: float32 [num_steps]}, "eval": {name: float32 [num_evals]}}}.
    """
    num_steps = setup.num_steps if num_steps is None else num_steps
    num_evals = len(setup.eval_steps) if num_evals is None else num_evals
    state = init_train_state(setup.task, setup.optimizer, key, ema=setup.ema_decay is not None,
                             step_key=setup.step_key)
    history = {"train": {k: np.full((num_steps,), np.nan, np.float32) for k in TRAIN_KEYS},
               "eval": {name: np.full((num_evals,), np.nan, np.float32) for name in setup.eval_names}}
    return {"state": state, "history": history}


def state_shardings(setup: TrainingSetup) -> Optional[Any]:
    """Where each leaf of the run's TrainState lives when its state is split over a mesh.

    Args:
        setup: the run.

    Returns:
        A TrainState of NamedShardings (`ParamSharding.state_shardings` of the initial state, whose params
        give the parameter shapes), or None when `setup.param_sharding` is None.
    """
    if setup.param_sharding is None:
        return None
    structure = jax.eval_shape(lambda k: init_train_state(setup.task, setup.optimizer, k,
                                                          ema=setup.ema_decay is not None, step_key=setup.step_key),
                               setup.init_key)
    return setup.param_sharding.state_shardings(structure, structure.params)


def saved_structure(setup: TrainingSetup, meta: dict) -> Any:
    """The structure of the tree a checkpoint of this run holds, from the checkpoint's metadata.

    Args:
        setup: the run resuming it.
        meta: the checkpoint's metadata (its "num_steps" and "eval_steps" size the histories).

    Returns:
        `jax.eval_shape` of `initial_tree` with the checkpoint's history lengths.
    """
    num_steps = int(meta.get("num_steps", setup.num_steps))
    num_evals = len(meta.get("eval_steps", setup.eval_steps))
    return jax.eval_shape(lambda k: initial_tree(setup, k, num_steps, num_evals), setup.init_key)


def extended_history(history: dict, meta: dict, step: int, setup: TrainingSetup) -> dict:
    """The histories of a checkpoint written by a run of another length, laid out for this one.

    Args:
        history: the checkpoint's histories (numpy arrays, laid out for its "num_steps" and "eval_steps").
        meta: the checkpoint's metadata.
        step: the checkpoint's step (what ran).
        setup: the extended run.

    Returns:
        Histories for `setup`: the train values of steps 1..step; for each of `setup.eval_steps` at or
        before `step`, the checkpoint's value there when it evaluated that step; NaN elsewhere.
    """
    train = {}
    for k in TRAIN_KEYS:
        train[k] = np.full((setup.num_steps,), np.nan, np.float32)
        ran = min(step, setup.num_steps, len(history["train"][k]))
        train[k][:ran] = history["train"][k][:ran]
    old_rows = {int(s): i for i, s in enumerate(meta.get("eval_steps", []))}
    evals = {}
    for name in setup.eval_names:
        evals[name] = np.full((len(setup.eval_steps),), np.nan, np.float32)
        for row, s in enumerate(setup.eval_steps):
            if s <= step and s in old_rows:
                evals[name][row] = history["eval"][name][old_rows[s]]
    return {"train": train, "eval": evals}


def training_checkpoints(setup: TrainingSetup,
                         manager_factory: Callable[[str, CheckpointPolicy], CheckpointManager] = CheckpointManager
                         ) -> RunCheckpoints:
    """The RunCheckpoints of a training run (constructing it reads and writes nothing).

    Args:
        setup: the run.
        manager_factory: builds its CheckpointManager (`train_loop` writes in a background thread).

    Returns:
        RunCheckpoints over `setup.files` with the run's metadata, TRAIN_RESULTS and HORIZON_KEYS.
    """
    files = setup.files
    return RunCheckpoints(files.output_dir, files.policy, setup.checkpoint_meta(), results=TRAIN_RESULTS,
                          checkpoint_dir=files.checkpoint_dir, manager_factory=manager_factory,
                          horizon_keys=HORIZON_KEYS)


def check_training_start(setup: TrainingSetup) -> Optional[int]:
    """Whether the run may start or resume as `setup.files` asks, without changing anything on disk.

    For callers that write files of their own only once the run is allowed (scripts/train.py's config.gin).

    Args:
        setup: the run (`prepare_training`).

    Returns:
        The step it would resume from, or None for a new run.

    Raises:
        ValueError, ExistingRunError, UnreadableCheckpointsError: as `RunCheckpoints.check_start` (the
            same refusals the run itself would raise).
    """
    files = setup.files
    return training_checkpoints(setup).check_start(resume=files.resume, overwrite=files.overwrite,
                                                   extend=files.extend)

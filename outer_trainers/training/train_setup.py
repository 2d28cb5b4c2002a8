"""What one model's training run is, checked and resolved before `train_loop` starts it.

    options = LoopOptions(log_every=100, chunk_size=100, yield_every=1000, progress="log")
    files = RunFiles(output_dir="run", policy=CheckpointPolicy(every_steps=500))
    setup = prepare_training(task, optax.adam(1e-3), 10_000, key=jax.random.key(0), evaluation=EvalPlan(every=500),
                             files=files, options=options)       # raises here on any bad argument
    setup.task, setup.evaluator, setup.eval_steps, setup.checkpoint_meta()

`train_loop` builds these three from its keyword arguments and hands the TrainingSetup to the
generator that trains, so every argument is checked at the call and nothing is read or written
(no checkpoint directory scanned, no thread started) before the first step is asked for.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Sequence, Union

import jax
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from outer_trainers.runs.checkpoint_policy import CheckpointPolicy
from outer_trainers.runs.summaries import PROGRESS_MODES
from outer_trainers.training.train_eval import EvalPlan, Evaluator, evaluation_steps, model_metrics
from outer_trainers.training.train_sharding import ParamSharding
from outer_trainers.training.train_state import TrainState, as_task, data_parallel_sharding
from tasks.base import Task

TRAIN_KEYS = ("loss", "grad_norm")  # per-step histories kept in checkpoints and the result
Callback = Callable[[int, TrainState, dict], None]


@dataclasses.dataclass(frozen=True)
class LoopOptions:
    """How the loop runs and reports: chunking, logging, yielding and callbacks.

    Attributes:
        log_every: log train metrics every this many steps (>= 1; also at evaluation steps and the last step).
        chunk_size: the most steps per jitted chunk (>= 1).
        yield_every: yield the TrainState every this many steps and at the last one (>= 1; None: only return).
        progress: True or "bar" (tqdm), "log" (plain lines on stderr), "auto" (a bar on a terminal, else lines
            every few seconds), False or "none"; stored as the mode name.
        tensorboard: also write TensorBoard event files under the output directory.
        callbacks: `callback(step, state, metrics)` after each step that evaluated or checkpointed.
    """

    log_every: int = 100
    chunk_size: int = 100
    yield_every: Optional[int] = None
    progress: Union[bool, str] = False
    tensorboard: bool = True
    callbacks: Sequence[Callback] = ()

    def __post_init__(self):
        for name in ("log_every", "chunk_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.yield_every is not None and self.yield_every < 1:
            raise ValueError(f"yield_every must be >= 1 or None, got {self.yield_every}")
        mode = {True: "bar", False: "none"}.get(self.progress, self.progress)
        if mode not in PROGRESS_MODES:
            raise ValueError(f"progress must be True, False or one of {PROGRESS_MODES}, got {self.progress!r}")
        object.__setattr__(self, "progress", mode)
        object.__setattr__(self, "callbacks", tuple(self.callbacks))
        bad = [c for c in self.callbacks if not callable(c)]
        if bad:
            raise TypeError(f"callbacks must be callables callback(step, state, metrics), got {bad}")


@dataclasses.dataclass(frozen=True)
class RunFiles:
    """Where a run's files go and how an existing run there is treated.

    Attributes:
        output_dir: where metrics.jsonl, tb/ and checkpoints/ go (None: nowhere).
        policy: when to checkpoint (None: `CheckpointPolicy()`, every 10 min and at the end, last 3 kept).
        checkpoint_dir: where checkpoints go (None: `output_dir`/checkpoints, or none without `output_dir`).
        resume: continue from the newest checkpoint, which must match this run.
        overwrite: start a new run, deleting a previous run's results first.
        config: JSON-able run configuration stored in checkpoints; it must match on resume.
        extend: a resumed run may continue to this run's num_steps from another (see `train_resume`).
    """

    output_dir: Optional[str] = None
    policy: Optional[CheckpointPolicy] = None
    checkpoint_dir: Optional[str] = None
    resume: bool = True
    overwrite: bool = False
    config: Optional[dict] = None
    extend: bool = False

    def __post_init__(self):
        if self.policy is None:
            object.__setattr__(self, "policy", CheckpointPolicy())
        if self.extend and (self.overwrite or not self.resume):
            raise ValueError("extend=True trains an existing run further: it cannot be combined with "
                             f"{'overwrite=True' if self.overwrite else 'resume=False'}, which start a new run")


@dataclasses.dataclass(frozen=True, eq=False)
class TrainingSetup:
    """A checked training run: what `train_loop`'s generator trains, evaluates, logs and checkpoints.

    Attributes:
        task: the trained Task.
        optimizer: the optax transform.
        num_steps: the run's length in steps.
        data: the DataSource, placed on the devices (None for data-free tasks).
        sharding: the batch sharding for data parallelism, or None on one device.
        replicated: the replicated sharding over the same devices (data; the state too without
            `param_sharding`), or None.
        init_key: the key of the initial TrainState.
        step_key: the key the train steps draw from.
        ema_decay: the decay of the params' EMA, or None for no EMA.
        ema_warmup_steps: steps over which the EMA decay ramps in.
        evaluator: runs the evaluations, or None when there are none.
        eval_steps: the steps at which it runs (sorted; empty without an evaluator).
        eval_names: the metric names it logs ("eval/<label>/<metric>", "eval_ema/...").
        files: where the run's files go.
        options: how the loop runs and reports.
        param_sharding: how the TrainState is split over a mesh (`train_sharding`), or None: replicated.
    """

    task: Task
    optimizer: optax.GradientTransformation
    num_steps: int
    data: Any
    sharding: Optional[NamedSharding]
    replicated: Optional[NamedSharding]
    init_key: jax.Array
    step_key: jax.Array
    ema_decay: Optional[float]
    ema_warmup_steps: int
    evaluator: Optional[Evaluator]
    eval_steps: tuple[int, ...]
    eval_names: tuple[str, ...]
    files: RunFiles
    options: LoopOptions
    param_sharding: Optional[ParamSharding] = None

    @property
    def num_devices(self) -> int:
        """The number of devices the run uses.

        Returns:
            The mesh's size (data parallelism or `param_sharding`), or 1 on one device.
        """
        return 1 if self.replicated is None else self.replicated.mesh.size

    def checkpoint_meta(self) -> dict:
        """The metadata stored in the run's checkpoints, which a resumed run must match ("num_steps" and
        "eval_steps" may differ with `files.extend`).

        Returns:
            {"kind", "task", "num_steps", "ema", "eval_metrics", "eval_steps"} and "config" when given.
        """
        meta = {"kind": "train_model", "task": self.task.name, "num_steps": self.num_steps,
                "ema": self.ema_decay is not None, "eval_metrics": list(self.eval_names),
                "eval_steps": list(self.eval_steps)}
        return dict(meta, config=self.files.config) if self.files.config is not None else meta


def prepare_training(task_or_model: Any, optimizer: optax.GradientTransformation, num_steps: int, *,
                     key: jax.Array, loss_fn: Optional[Callable] = None, data: Any = None,
                     ema_decay: Optional[float] = None, ema_warmup_steps: int = 0, evaluation: EvalPlan = EvalPlan(),
                     devices: Optional[Sequence[jax.Device]] = None, files: RunFiles = RunFiles(),
                     options: LoopOptions = LoopOptions(), sharding: Optional[ParamSharding] = None) -> TrainingSetup:
    """Checks a training run's arguments and resolves them into a TrainingSetup.

    Builds the Task (`as_task`), places its data on the devices (data parallelism, or the mesh of
    `sharding`), builds the
    Evaluator and its steps, and checks that the checkpoint policy's `best_metric` is a metric the
    run logs. Reads and writes no file.

    Args:
        task_or_model: a tasks.Task, or a flax linen Module, nnx constructor or haiku function (with `loss_fn`, `data`).
        optimizer: any optax transform.
        num_steps: training steps (>= 0).
        key: the run's PRNG key (init, steps and evaluation keys are split from it).
        loss_fn: the model's loss `loss_fn(outputs, batch) -> scalar` (models only).
        data: the DataSource (default: the task's own).
        ema_decay: keep an EMA of params with this decay, in [0, 1) (None: no EMA).
        ema_warmup_steps: steps over which the EMA decay ramps in (>= 0).
        evaluation: what is evaluated and when (`EvalPlan`).
        devices: devices for data parallelism (default: all local; not with `sharding`).
        files: where the run's files go.
        options: how the loop runs and reports.
        sharding: split the state's large leaves and each batch over a mesh axis (`ParamSharding`, FSDP), or
            None: data parallelism over `devices` with the state replicated.

    Returns:
        The TrainingSetup.

    Raises:
        ValueError, TypeError: an argument is out of range or of the wrong kind (named in the message).
    """
    if num_steps < 0:
        raise ValueError(f"num_steps must be >= 0, got {num_steps}")
    if ema_decay is not None and not 0.0 <= ema_decay < 1.0:
        raise ValueError(f"ema_decay must be in [0, 1) or None, got {ema_decay}")
    if ema_warmup_steps < 0:
        raise ValueError(f"ema_warmup_steps must be >= 0, got {ema_warmup_steps}")
    if not isinstance(evaluation, EvalPlan):
        raise TypeError(f"evaluation must be an EvalPlan (e.g. EvalPlan(every=100)), got {type(evaluation).__name__}")
    eval_steps = evaluation_steps(num_steps, evaluation.every, evaluation.at)
    task = as_task(task_or_model, loss_fn, data)
    data = task.data if data is None else data
    param_sharding = sharding
    if param_sharding is not None:
        if not isinstance(param_sharding, ParamSharding):
            raise TypeError(f"sharding must be a ParamSharding (e.g. ParamSharding(jax.make_mesh((4,), ('fsdp',)))), "
                            f"got {type(param_sharding).__name__}")
        if devices is not None:
            raise ValueError("give devices or sharding, not both: a ParamSharding's mesh names the devices")
        if data is not None:
            param_sharding.check_batch_size(getattr(data, "batch_size", 0))
        sharding = param_sharding.batch if data is not None else None
        replicated = param_sharding.replicated
    else:
        sharding = data_parallel_sharding(data, devices)
        replicated = None if sharding is None else NamedSharding(sharding.mesh, P())
    if replicated is not None:
        data = jax.device_put(data, replicated)
    init_key, step_key, eval_key = jax.random.split(key, 3)

    evaluations, metrics = evaluation.evaluations(), evaluation.metrics
    extra = metrics if isinstance(task_or_model, Task) else model_metrics(task_or_model, data, metrics)
    evaluator = Evaluator(evaluations, task, data, eval_key, extra, placement=replicated) if evaluations else None
    eval_names = evaluator.metric_names(ema_decay is not None) if evaluator else []

    logged = set(eval_names) | {f"train/{k}" for k in TRAIN_KEYS} | {"train/param_norm"}
    best = files.policy.best_metric
    if best and best not in logged:
        raise ValueError(f"best_metric {best!r} is not a logged metric; choose from {sorted(logged)}")
    return TrainingSetup(task=task, optimizer=optimizer, num_steps=int(num_steps), data=data, sharding=sharding,
                         replicated=replicated, init_key=init_key, step_key=step_key, ema_decay=ema_decay,
                         ema_warmup_steps=ema_warmup_steps, evaluator=evaluator,
                         eval_steps=tuple(eval_steps) if evaluator else (), eval_names=tuple(eval_names),
                         files=files, options=options, param_sharding=param_sharding)

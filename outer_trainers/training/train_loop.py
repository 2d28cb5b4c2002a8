"""train_loop: train one model with any optax transform, as a full training loop.

    for state in train_loop(task, tx, 10_000, output_dir="run", eval_every=500, yield_every=1000):
        ...                                   # a notebook looks at the TrainState every 1000 steps
    result = train_model(task, tx, 10_000, output_dir="run", eval_every=500)   # the same loop, run to the end

The loop, step by step:

    restore or init ─► steps in jitted chunks (one compile; data parallel over local devices)
        ─► at eval steps: every Evaluation on params (and EMA params)
        ─► at log steps: metrics.jsonl, TensorBoard, progress
        ─► checkpoints as the policy says (written in a background thread) ─► callbacks ─► yield

Chunks end at every step something happens (log, eval, checkpoint, yield), so each happens at its
exact step. With `output_dir`:

    metrics.jsonl   one line per logged step: "train/loss" (mean over the last `log_every` steps),
                    "train/grad_norm" (same window), "train/param_norm", "train/steps_per_s",
                    "train/examples_per_s", "train/examples_per_s_per_device" (since the last logged
                    step; the first interval includes compilation), "elapsed_s", and at
                    evaluation steps "eval/<label>/<metric>" (and "eval_ema/<label>/<metric>");
                    step 0 of a new run: "model/num_params", "model/param_bytes"
    tb/             the same scalars as TensorBoard events
    checkpoints/    TrainState + the loss, grad-norm and evaluation histories (outer_trainers.runs.checkpoint_manager)

Re-running with the same `output_dir` resumes from the newest complete checkpoint: the result,
EMA and evaluation history included, is bit-identical to an uninterrupted run. The pieces are the
outer loop's: `RunCheckpoints` and `CheckpointPolicy` (rolling every N steps / T seconds keeping
the last k, permanent at given steps or every M, best by a logged metric), `MetricsLog`, `Progress`.
"""
from __future__ import annotations

import functools
import logging
import sys
import time
from typing import Any, Callable, Generator, Mapping, NamedTuple, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from outer_trainers.runs.background_checkpoints import BackgroundCheckpointManager
from outer_trainers.runs.checkpoint_policy import CheckpointPolicy
from outer_trainers.runs.reporting import RunTotals
from outer_trainers.runs.run_checkpoints import CHECKPOINT_DIR, RunCheckpoints
from outer_trainers.runs.summaries import METRICS_FILE, TB_DIR, MetricsLog, Progress
from outer_trainers.training.train_eval import EMA_PREFIX, EVAL_PREFIX, Evaluation, Evaluator, evaluation_steps, model_metrics
from outer_trainers.training.train_state import TrainState, as_task, data_parallel_sharding, init_train_state, train_step
from tasks.base import Task

logger = logging.getLogger("outer_trainers")
TRAIN_KEYS = ("loss", "grad_norm")  # per-step histories kept in checkpoints and the result
TRAIN_RESULTS = (METRICS_FILE, TB_DIR, CHECKPOINT_DIR)  # what a run leaves in output_dir (never silently replaced)
Callback = Callable[[int, TrainState, dict], None]


class TrainResult(NamedTuple):
    """What `train_model` returns (and `train_loop` returns when it finishes).

    Attributes:
        state: the final TrainState.
        losses: float32 [num_steps]: the train loss of every step.
        eval_loss: the first Evaluation's loss at the last step (NaN without evaluations).
        ema_eval_loss: the same with the EMA params when `ema_decay` is set, else None.
        grad_norms: float32 [num_steps]: the gradient's global norm at every step.
        eval_steps: int [E]: the steps at which the evaluations ran.
        evals: {"eval/<label>/<metric>" (and "eval_ema/..."): float32 [E]}, one value per evaluation step.
    """
    state: TrainState
    losses: np.ndarray
    eval_loss: float
    ema_eval_loss: Optional[float]
    grad_norms: Optional[np.ndarray] = None
    eval_steps: Optional[np.ndarray] = None
    evals: Optional[dict] = None


TRAIN_PROGRESS_FIELDS = (("loss", "train/loss"), ("steps/s", "train/steps_per_s"),
                         ("examples/s", "train/examples_per_s"))


def param_count(params: Any) -> tuple[int, int]:
    """The number of parameters and their bytes.

    Args:
        params: a pytree of arrays (or ShapeDtypeStructs).

    Returns:
        (Σ leaf sizes, Σ leaf sizes · itemsize).
    """
    leaves = jax.tree_util.tree_leaves(params)
    return (int(sum(np.prod(x.shape, dtype=np.int64) for x in leaves)),
            int(sum(np.prod(x.shape, dtype=np.int64) * np.dtype(x.dtype).itemsize for x in leaves)))


def _check_arguments(num_steps, log_every, chunk_size, yield_every, ema_decay, ema_warmup_steps, callbacks):
    if num_steps < 0:
        raise ValueError(f"num_steps must be >= 0, got {num_steps}")
    for name, value in (("log_every", log_every), ("chunk_size", chunk_size)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if yield_every is not None and yield_every < 1:
        raise ValueError(f"yield_every must be >= 1 or None, got {yield_every}")
    if ema_decay is not None and not 0.0 <= ema_decay < 1.0:
        raise ValueError(f"ema_decay must be in [0, 1) or None, got {ema_decay}")
    if ema_warmup_steps < 0:
        raise ValueError(f"ema_warmup_steps must be >= 0, got {ema_warmup_steps}")
    bad = [c for c in callbacks if not callable(c)]
    if bad:
        raise TypeError(f"callbacks must be callables callback(step, state, metrics), got {bad}")


def _next_stop(step: int, num_steps: int, chunk_size: int, every: Sequence[Optional[int]],
               at: Sequence[int]) -> int:
    """The end of the chunk that starts at `step`: the first step after it where something happens."""
    stops = [num_steps, step + chunk_size] + [(step // e + 1) * e for e in every if e]
    stops += [s for s in at if s > step]
    return min(stops)


def _history(num_steps: int, eval_names: Sequence[str], num_evals: int) -> dict:
    return {"train": {k: np.full((num_steps,), np.nan, np.float32) for k in TRAIN_KEYS},
            "eval": {name: np.full((num_evals,), np.nan, np.float32) for name in eval_names}}


def run_to_end(loop: Generator[TrainState, None, TrainResult]) -> TrainResult:
    """Runs a `train_loop` generator to its end (the states it still yields are dropped).

    Args:
        loop: a `train_loop(...)` generator, fresh or partly iterated.

    Returns:
        Its TrainResult.
    """
    while True:
        try:
            next(loop)
        except StopIteration as done:
            return done.value


def _primed(generator_fn: Callable) -> Callable:
    """Starts the generator at once, so its code up to its first (bare) `yield` — the argument checks — runs
    at the call, not at the first `next`."""
    @functools.wraps(generator_fn)
    def start(*args, **kwargs):
        generator = generator_fn(*args, **kwargs)
        next(generator)
        return generator

    return start


@_primed
def train_loop(task_or_model: Any, optimizer: optax.GradientTransformation, num_steps: int, *,
               loss_fn: Optional[Callable] = None, data: Any = None, seed: int = 0, key: Optional[jax.Array] = None,
               ema_decay: Optional[float] = None, ema_warmup_steps: int = 0,
               evals: Optional[Sequence[Union[Evaluation, str]]] = None, eval_every: Optional[int] = None,
               eval_at: Sequence[int] = (), eval_split: str = "test", eval_batches: int = 8,
               metrics: Optional[Mapping[str, Callable]] = None, output_dir: Optional[str] = None,
               checkpoint_policy: Optional[CheckpointPolicy] = None, checkpoint_dir: Optional[str] = None,
               resume: bool = True, overwrite: bool = False, log_every: int = 100, progress: Union[bool, str] = False,
               tensorboard: bool = True, callbacks: Sequence[Callback] = (), yield_every: Optional[int] = None,
               chunk_size: int = 100, devices: Optional[Sequence[jax.Device]] = None,
               config: Optional[dict] = None) -> Generator[TrainState, None, TrainResult]:
    """Trains a model for `num_steps` steps of `optimizer`, yielding the TrainState every `yield_every` steps.

    A generator: `for state in train_loop(...)` sees the state at steps k · yield_every and at the
    last step; when it finishes it returns the TrainResult (`StopIteration.value`; `run_to_end(loop)`
    runs it to the end and returns it, as `train_model` does). Bad arguments raise at the call.
    Leaving the loop early (`loop.close()`, or dropping the generator) closes the files and waits
    for the checkpoint writes; the run resumes from its newest checkpoint when started again.

    Args:
        task_or_model: a tasks.Task, or a flax linen Module, nnx constructor or haiku function (with `loss_fn`, `data`).
        optimizer: any optax transform; a learned optimizer's (GradientTransformationExtraArgs) gets `loss=`.
        num_steps: training steps (>= 0); a resumed run trains up to it.
        loss_fn: the model's loss `loss_fn(outputs, batch) -> scalar` (models only).
        data: the DataSource (default: the task's own).
        seed: seed of the run's key (when `key` is None).
        key: the run's PRNG key (init, steps and evaluation keys are split from it).
        ema_decay: keep an EMA of params with this decay, in [0, 1), evaluated beside the params (None: no EMA).
        ema_warmup_steps: steps over which the EMA decay ramps in linearly from 0 (`ema_decay_at`).
        evals: the Evaluations (or split names) run at evaluation steps (None: `Evaluation(eval_split,
            num_batches=eval_batches)`; empty: none).
        eval_every: evaluate every this many steps (>= 1; None: only at `eval_at` and the last step).
        eval_at: further steps to evaluate at (0: before training).
        eval_split: the split of the default evaluation.
        eval_batches: batches the default evaluation averages over.
        metrics: metrics added to every evaluation: for a Task `fn(params, model_state, key, batch)`, for a
            model `fn(outputs, batch)` like `loss_fn` (a classifier model gets "accuracy" without asking).
        output_dir: where metrics.jsonl, tb/ and checkpoints/ go (None: nowhere).
        checkpoint_policy: when to checkpoint (default `CheckpointPolicy()`: every 10 min and at the end, last 3
            kept); needs `output_dir` or `checkpoint_dir`.
        checkpoint_dir: where checkpoints go (default: `output_dir`/checkpoints).
        resume: continue from the newest checkpoint (which must match this run); a new run (none, or
            resume=False) refuses to start over another run's metrics.jsonl, tb/ or checkpoints/ in `output_dir`.
        overwrite: start a new run, deleting those results of a previous run first.
        log_every: log train metrics every this many steps (and at evaluation steps and the last step).
        progress: True or "bar" (tqdm), "log" (plain lines on stderr), False or "none".
        tensorboard: also write TensorBoard event files under `output_dir`/tb.
        callbacks: `callback(step, state, metrics)` after each step that evaluated or checkpointed (metrics:
            that step's logged metrics, evaluation results included; {} when the step was not logged).
        yield_every: yield the TrainState every this many steps and at the last one (None: only returns).
        chunk_size: the most steps per jitted chunk.
        devices: devices for data parallelism (default: all local).
        config: JSON-able run configuration stored in checkpoints; it must match on resume.

    Returns:
        A generator of TrainStates that returns the TrainResult.
    """
    callbacks = list(callbacks)
    _check_arguments(num_steps, log_every, chunk_size, yield_every, ema_decay, ema_warmup_steps, callbacks)
    eval_steps = evaluation_steps(num_steps, eval_every, eval_at)
    task = as_task(task_or_model, loss_fn, data)
    data = task.data if data is None else data
    key = jax.random.key(seed) if key is None else key
    sharding = data_parallel_sharding(data, devices)
    num_devices = 1 if sharding is None else sharding.mesh.size
    replicated = None if sharding is None else NamedSharding(sharding.mesh, P())
    if replicated is not None:
        data = jax.device_put(data, replicated)
    k_init, k_train, k_eval = jax.random.split(key, 3)

    evaluations = [Evaluation(eval_split, num_batches=eval_batches)] if evals is None else list(evals)
    extra = model_metrics(task_or_model, data, metrics) if not isinstance(task_or_model, Task) else metrics
    evaluator = Evaluator(evaluations, task, data, k_eval, extra, placement=replicated) if evaluations else None
    eval_names = evaluator.metric_names(ema_decay is not None) if evaluator else []
    eval_steps = eval_steps if evaluator else []

    policy = checkpoint_policy or CheckpointPolicy()
    logged_names = set(eval_names) | {f"train/{k}" for k in TRAIN_KEYS} | {"train/param_norm"}
    if policy.best_metric and policy.best_metric not in logged_names:
        raise ValueError(f"best_metric {policy.best_metric!r} is not a logged metric; choose from "
                         f"{sorted(logged_names)}")
    yield  # the arguments are checked: `_primed` returns the generator here
    meta = {"kind": "train_model", "task": task.name, "num_steps": int(num_steps), "ema": ema_decay is not None,
            "eval_metrics": eval_names, "eval_steps": eval_steps}
    meta = dict(meta, config=config) if config is not None else meta
    run = RunCheckpoints(output_dir, policy, meta, results=TRAIN_RESULTS, checkpoint_dir=checkpoint_dir,
                         manager_factory=BackgroundCheckpointManager)  # writes in a background thread

    def init(k):
        state = init_train_state(task, optimizer, k, ema=ema_decay is not None, step_key=k_train)
        return {"state": state, "history": _history(num_steps, eval_names, len(eval_steps))}

    tree, totals = run.restore_or_init(jax.jit(init), k_init, resume=resume, overwrite=overwrite)
    state, history = tree["state"], jax.tree_util.tree_map(np.array, tree["history"])
    if replicated is not None:
        state = jax.device_put(state, replicated)
    start = int(state.step)

    def chunk(state, data, n):  # n (traced) <= chunk_size steps: one compile serves every chunk length
        def body(carry):
            i, s, out = carry
            s, m = train_step(task, optimizer, s, data, ema_decay=ema_decay, ema_warmup_steps=ema_warmup_steps,
                              batch_sharding=sharding, with_metrics=True)
            return i + 1, s, {k: out[k].at[i].set(m[k]) for k in TRAIN_KEYS}

        out = {k: jnp.full((chunk_size,), jnp.nan, jnp.float32) for k in TRAIN_KEYS}
        _, state, out = jax.lax.while_loop(lambda c: c[0] < n, body, (jnp.zeros((), jnp.int32), state, out))
        return state, out

    run_chunk = jax.jit(chunk)
    param_norm = jax.jit(optax.tree.norm)
    mode = {True: "bar", False: "none"}.get(progress, progress)
    log = MetricsLog(output_dir, resume_step=start if start > 0 else -1, tensorboard=tensorboard)
    bar = Progress(mode, total=num_steps, initial=start, desc="train", fields=TRAIN_PROGRESS_FIELDS)
    batch_size = getattr(data, "batch_size", 0) if data is not None else 0
    elapsed0, t_start = totals.elapsed_s, time.perf_counter()
    t_logged, steps_logged = t_start, start
    every = (log_every, yield_every, policy.every_steps, policy.permanent_every)
    at = sorted(set(eval_steps) | set(policy.checkpoints_at))

    def report(step: int) -> Optional[dict]:
        """Evaluates and logs step `step` if due; the logged metrics or None."""
        nonlocal t_logged, steps_logged
        evaluate = step in eval_steps
        if not (evaluate or step % log_every == 0 or step == num_steps):
            return None
        now = time.perf_counter()
        logged = {"elapsed_s": elapsed0 + now - t_start}
        if step > 0:
            window = slice(max(0, step - log_every), step)
            logged.update({f"train/{k}": float(np.mean(history["train"][k][window])) for k in TRAIN_KEYS})
            logged["train/param_norm"] = float(param_norm(state.params))
        if step > steps_logged:
            rate = (step - steps_logged) / max(now - t_logged, 1e-9)
            logged["train/steps_per_s"] = rate
            if batch_size:
                logged["train/examples_per_s"] = rate * batch_size
                logged["train/examples_per_s_per_device"] = rate * batch_size / num_devices
        if step == 0:
            logged["model/num_params"], logged["model/param_bytes"] = param_count(state.params)
        if evaluate:
            results = evaluator(state.params, state.model_state, state.ema_params)
            row = eval_steps.index(step)
            for name, value in results.items():
                history["eval"][name][row] = value
            logged.update(results)
        log.write(step, logged)
        t_logged, steps_logged = time.perf_counter(), step
        return logged

    try:
        num_params, num_bytes = param_count(state.params)
        logger.info("training %s: %d parameters (%d bytes) on %d device(s)", task.name, num_params, num_bytes,
                    num_devices)
        if mode != "none":
            print(f"{task.name}: {num_params:,} parameters, {num_bytes / 2**20:.2f} MiB; "
                  f"{num_devices} device(s); steps {start} -> {num_steps}", file=sys.stderr, flush=True)
        if start == 0:  # step 0 is always logged: the model's size (and an evaluation at step 0)
            logged = report(0)
            for callback in callbacks if 0 in eval_steps else ():
                callback(0, state, dict(logged))
        step = start
        while step < num_steps:
            stop = _next_stop(step, num_steps, chunk_size, every, at)
            state, out = run_chunk(state, data, jnp.asarray(stop - step, jnp.int32))
            out = jax.device_get(out)
            for k in TRAIN_KEYS:
                history["train"][k][step:stop] = out[k][:stop - step]
            taken, step = stop - step, stop
            logged = report(step)
            totals = RunTotals(elapsed0 + time.perf_counter() - t_start, 0)
            run.save(step, {"state": state, "history": history}, totals, logged, final=step == num_steps)
            bar.update(taken, logged)
            saved = run.manager is not None and run.manager.last_save_step == step
            if callbacks and (step in eval_steps or saved):
                for callback in callbacks:
                    callback(step, state, dict(logged or {}))
            if yield_every and (step % yield_every == 0 or step == num_steps):
                yield state
        if run.manager is not None:
            run.manager.wait()
    finally:
        bar.close()
        log.close()
        if run.manager is not None:
            run.manager.close()

    first_loss = f"{EVAL_PREFIX}/{evaluator.evaluations[0].label}/loss" if evaluator else ""
    final = lambda name: float(history["eval"][name][-1]) if name in history["eval"] else float("nan")
    ema_loss = final(first_loss.replace(EVAL_PREFIX, EMA_PREFIX, 1)) if ema_decay is not None else None
    return TrainResult(state, history["train"]["loss"], final(first_loss), ema_loss, history["train"]["grad_norm"],
                       np.asarray(eval_steps, np.int64), history["eval"])

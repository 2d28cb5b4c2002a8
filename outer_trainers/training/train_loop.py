"""train_loop: train one model with any optax transform, as a full training loop.

    for state in train_loop(task, tx, 10_000, output_dir="run", evaluation=EvalPlan(every=500),
                            options=LoopOptions(yield_every=1000, progress="log")):
        ...                                   # a notebook looks at the TrainState every 1000 steps
    result = train_model(task, tx, 10_000, output_dir="run", evaluation=EvalPlan(every=500))   # run to the end

The loop, step by step:

    arguments checked (train_setup.prepare_training) ─► restore or init
        ─► steps in jitted chunks (one compile; data parallel over local devices, or the state and
           batches split over a mesh axis with `sharding=ParamSharding(mesh)`: train_sharding)
        ─► at eval steps: every Evaluation on params (and EMA params)
        ─► at log steps: metrics.jsonl, TensorBoard, progress
        ─► checkpoints as the policy says (written in a background thread) ─► callbacks ─► yield

`train_loop` checks its arguments at the call and returns a generator (`run_training`) that does the
rest. Chunks end at every step something happens (log, eval, checkpoint, yield), so each happens
at its exact step. With `output_dir`:

    metrics.jsonl   one line per logged step: "train/loss" (mean over the last `log_every` steps),
                    "train/grad_norm" (same window), "train/param_norm", "train/steps_per_s",
                    "train/examples_per_s", "train/examples_per_s_per_device" (since the last logged
                    step; the first interval includes compilation), "elapsed_s", and at
                    evaluation steps "eval/<label>/<metric>" (and "eval_ema/<label>/<metric>");
                    step 0 of a new run: "model/num_params", "model/param_bytes"
    tb/             the same scalars as TensorBoard events
    checkpoints/    TrainState + the loss, grad-norm and evaluation histories (outer_trainers.runs.checkpoint_manager)

Re-running with the same `output_dir` resumes from the newest complete checkpoint: the result,
EMA and evaluation history included, is bit-identical to an uninterrupted run. A resume with
another `num_steps` is refused unless `extend=True`, which trains a finished or interrupted run
further (to at least the steps it has taken) and records it in the run's config history;
`train_resume` says what happens to the optimizer's schedule, the evaluations and the histories.
The pieces are the outer loop's: `RunCheckpoints` and `CheckpointPolicy` (rolling every N steps / T
seconds keeping the last k, permanent at given steps or every M, best by a logged metric),
`MetricsLog`, `Progress`.
"""
from __future__ import annotations

import logging
import sys
import time
from typing import Any, Callable, Generator, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from outer_trainers.runs.background_checkpoints import BackgroundCheckpointManager
from outer_trainers.runs.checkpoint_policy import CheckpointPolicy
from outer_trainers.runs.reporting import RunTotals
from outer_trainers.runs.summaries import MetricsLog, Progress
from outer_trainers.training.train_eval import EMA_PREFIX, EVAL_PREFIX, EvalPlan
from outer_trainers.training.train_resume import (extended_history, initial_tree, saved_structure, state_shardings,
                                                  training_checkpoints)
from outer_trainers.training.train_setup import TRAIN_KEYS, LoopOptions, RunFiles, TrainingSetup, prepare_training
from outer_trainers.training.train_sharding import ParamSharding
from outer_trainers.training.train_state import TrainState, train_step

logger = logging.getLogger("outer_trainers")
TRAIN_PROGRESS_FIELDS = (("loss", "train/loss"), ("steps/s", "train/steps_per_s"),
                         ("examples/s", "train/examples_per_s"))


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


def train_loop(task_or_model: Any, optimizer: optax.GradientTransformation, num_steps: int, *,
               loss_fn: Optional[Callable] = None, data: Any = None, seed: int = 0, key: Optional[jax.Array] = None,
               ema_decay: Optional[float] = None, ema_warmup_steps: int = 0, evaluation: EvalPlan = EvalPlan(),
               output_dir: Optional[str] = None, checkpoint_policy: Optional[CheckpointPolicy] = None,
               checkpoint_dir: Optional[str] = None, resume: bool = True, overwrite: bool = False,
               options: LoopOptions = LoopOptions(), devices: Optional[Sequence[jax.Device]] = None,
               config: Optional[dict] = None, extend: bool = False,
               sharding: Optional[ParamSharding] = None) -> Generator[TrainState, None, TrainResult]:
    """Trains a model for `num_steps` steps of `optimizer`, yielding the TrainState every `options.yield_every` steps.

    Returns a generator: `for state in train_loop(...)` sees the state at steps k · yield_every and at
    the last step; when it finishes it returns the TrainResult (`StopIteration.value`; `run_to_end(loop)`
    runs it to the end and returns it, as `train_model` does). Bad arguments raise at the call
    (`prepare_training`); no file is read or written before the first step is asked for.
    Leaving the loop early (`loop.close()`, or dropping the generator) closes the files and waits
    for the checkpoint writes; the run resumes from its newest checkpoint when started again.

    Args:
        task_or_model: a tasks.Task, or a flax linen Module, nnx constructor or haiku function (with `loss_fn`, `data`).
        optimizer: any optax transform; a learned optimizer's (GradientTransformationExtraArgs) gets `loss=`.
        num_steps: training steps (>= 0); a resumed run trains up to it (another length than the checkpoint's
            needs `extend`).
        loss_fn: the model's loss `loss_fn(outputs, batch) -> scalar` (models only).
        data: the DataSource (default: the task's own).
        seed: seed of the run's key (when `key` is None).
        key: the run's PRNG key (init, steps and evaluation keys are split from it).
        ema_decay: keep an EMA of params with this decay, in [0, 1), evaluated beside the params (None: no EMA).
        ema_warmup_steps: steps over which the EMA decay ramps in linearly from 0 (`ema_decay_at`).
        evaluation: what is evaluated and when (`EvalPlan`: every, at, evals, split, batches, metrics); the
            default evaluates the "test" split at the last step.
        output_dir: where metrics.jsonl, tb/ and checkpoints/ go (None: nowhere).
        checkpoint_policy: when to checkpoint (default `CheckpointPolicy()`: every 10 min and at the end, last 3
            kept); needs `output_dir` or `checkpoint_dir`.
        checkpoint_dir: where checkpoints go (default: `output_dir`/checkpoints).
        resume: continue from the newest checkpoint (which must match this run); a new run (none, or
            resume=False) refuses to start over another run's metrics.jsonl, tb/ or checkpoints/ in `output_dir`.
        overwrite: start a new run, deleting those results of a previous run first.
        options: how the loop runs and reports (`LoopOptions`): log_every (train metrics every this many
            steps, and at evaluation steps and the last step; default 100), progress (True or "bar", "log",
            "auto", False or "none"; default none), tensorboard, callbacks (`callback(step, state, metrics)`
            after each step that evaluated or checkpointed), yield_every (None: only returns), chunk_size.
        devices: devices for data parallelism (default: all local); the state is replicated on each.
        config: JSON-able run configuration stored in checkpoints; it must match on resume.
        extend: train the run in `output_dir` further: resume its checkpoint, written by a run of another
            `num_steps` (finished or interrupted), and continue to `num_steps` (at least the steps it has
            taken; fewer is refused, changing nothing). Pass `optimizer` built for the new horizon: the
            optimizer state continues, and a schedule over num_steps gives the new horizon's values from
            the checkpoint's step on (`train_resume` for the rule, the evaluations and the histories).
            Recorded in the checkpoints' config history (`runs.run_checkpoints.config_history`). Without it
            such a resume is refused ("does not match this run: num_steps").
        sharding: split the params, optimizer state and EMA over a mesh axis instead of replicating them, and
            each batch over the same axis (`ParamSharding(mesh, axis)`: fully sharded data parallelism; the
            rule is `train_sharding`'s). Not with `devices`. Load a learned optimizer with `layout="sharded"`.

    Returns:
        A generator of TrainStates that returns the TrainResult.

    Raises:
        ValueError, TypeError: an argument is out of range or of the wrong kind (at the call).
    """
    if not isinstance(options, LoopOptions):
        raise TypeError(f"options must be a LoopOptions (e.g. LoopOptions(log_every=10)), got {type(options).__name__}")
    files = RunFiles(output_dir=output_dir, policy=checkpoint_policy, checkpoint_dir=checkpoint_dir, resume=resume,
                     overwrite=overwrite, config=config, extend=extend)
    setup = prepare_training(task_or_model, optimizer, num_steps, key=jax.random.key(seed) if key is None else key,
                             loss_fn=loss_fn, data=data, ema_decay=ema_decay, ema_warmup_steps=ema_warmup_steps,
                             evaluation=evaluation, devices=devices, files=files, options=options, sharding=sharding)
    return run_training(setup)


def run_training(setup: TrainingSetup) -> Generator[TrainState, None, TrainResult]:
    """The training run of a checked setup, as `train_loop` describes it.

    Args:
        setup: the run (`train_setup.prepare_training`).

    Returns:
        A generator of TrainStates (every `setup.options.yield_every` steps and at the last one) that
        returns the TrainResult.
    """
    files, options, num_steps = setup.files, setup.options, setup.num_steps
    run = training_checkpoints(setup, BackgroundCheckpointManager)  # writes in a background thread
    placement = state_shardings(setup)  # None: the state is replicated (or on one device)
    split = {} if placement is None else {"out_shardings": {"state": placement, "history": setup.replicated}}
    tree, totals = run.restore_or_init(jax.jit(lambda k: initial_tree(setup, k), **split), setup.init_key,
                                       resume=files.resume,
                                       overwrite=files.overwrite, extend=files.extend,
                                       structure_for=lambda _, meta: saved_structure(setup, meta))
    state, history = tree["state"], jax.tree_util.tree_map(np.array, tree["history"])
    if run.extension is not None:  # histories laid out for the checkpoint's length: lay them out for this one
        history = extended_history(history, run.resumed_meta, int(state.step), setup)
    if setup.replicated is not None:  # a restored state is split again over the mesh
        state = jax.device_put(state, setup.replicated if placement is None else placement)
    start = int(state.step)
    split = {} if placement is None else {"out_shardings": (placement, setup.replicated)}
    run_chunk = jax.jit(lambda s, data, n: _chunk(setup, s, data, n, placement), **split)
    log = MetricsLog(files.output_dir, resume_step=start if start > 0 else -1, tensorboard=options.tensorboard)
    bar = Progress(options.progress, total=num_steps, initial=start, desc="train", fields=TRAIN_PROGRESS_FIELDS)
    report = _StepReport(setup, history, log, totals.elapsed_s, start)
    every = (options.log_every, options.yield_every, files.policy.every_steps, files.policy.permanent_every)
    at = sorted(set(setup.eval_steps) | set(files.policy.checkpoints_at))
    try:
        _announce(setup, state, start)
        if start == 0:  # step 0 is always logged: the model's size (and an evaluation at step 0)
            logged = report(0, state)
            for callback in options.callbacks if 0 in setup.eval_steps else ():
                callback(0, state, dict(logged))
        step = start
        while step < num_steps:
            stop = _next_stop(step, num_steps, options.chunk_size, every, at)
            state, out = run_chunk(state, setup.data, jnp.asarray(stop - step, jnp.int32))
            out = jax.device_get(out)
            for k in TRAIN_KEYS:
                history["train"][k][step:stop] = out[k][:stop - step]
            taken, step = stop - step, stop
            logged = report(step, state)
            run.save(step, {"state": state, "history": history}, report.totals(), logged, final=step == num_steps)
            bar.update(taken, logged)
            saved = run.manager is not None and run.manager.last_save_step == step
            if options.callbacks and (step in setup.eval_steps or saved):
                for callback in options.callbacks:
                    callback(step, state, dict(logged or {}))
            if options.yield_every and (step % options.yield_every == 0 or step == num_steps):
                yield state
        if run.manager is not None:
            run.manager.wait()
    finally:
        bar.close()
        log.close()
        if run.manager is not None:
            run.manager.close()
    return _result(setup, state, history)


def _chunk(setup: TrainingSetup, state: TrainState, data: Any, n: jax.Array,
           placement: Optional[TrainState] = None) -> tuple[TrainState, dict]:
    """`n` (traced, <= chunk_size) train steps and their metrics: one compile serves every chunk length.

    With `placement` (the state's shardings), the state stays split so after every step."""
    def body(carry):
        i, s, out = carry
        s, m = train_step(setup.task, setup.optimizer, s, data, ema_decay=setup.ema_decay,
                          ema_warmup_steps=setup.ema_warmup_steps, batch_sharding=setup.sharding, with_metrics=True)
        if placement is not None:
            s = jax.lax.with_sharding_constraint(s, placement)
        return i + 1, s, {k: out[k].at[i].set(m[k]) for k in TRAIN_KEYS}

    out = {k: jnp.full((setup.options.chunk_size,), jnp.nan, jnp.float32) for k in TRAIN_KEYS}
    _, state, out = jax.lax.while_loop(lambda c: c[0] < n, body, (jnp.zeros((), jnp.int32), state, out))
    return state, out


def _next_stop(step: int, num_steps: int, chunk_size: int, every: Sequence[Optional[int]],
               at: Sequence[int]) -> int:
    """The end of the chunk that starts at `step`: the first step after it where something happens."""
    stops = [num_steps, step + chunk_size] + [(step // e + 1) * e for e in every if e]
    stops += [s for s in at if s > step]
    return min(stops)


def _announce(setup: TrainingSetup, state: TrainState, start: int) -> None:
    """Logs (and, with a progress display, prints) the model's size, the devices and the steps to take."""
    num_params, num_bytes = param_count(state.params)
    logger.info("training %s: %d parameters (%d bytes) on %d device(s)", setup.task.name, num_params, num_bytes,
                setup.num_devices)
    if setup.options.progress != "none":
        print(f"{setup.task.name}: {num_params:,} parameters, {num_bytes / 2**20:.2f} MiB; {setup.num_devices} "
              f"device(s); steps {start} -> {setup.num_steps}", file=sys.stderr, flush=True)


class _StepReport:
    """Evaluates and logs the steps that are due: train-window means, throughput, model size, evaluations."""

    def __init__(self, setup: TrainingSetup, history: dict, log: MetricsLog, elapsed0: float, start: int):
        self.setup, self.history, self.log, self.elapsed0 = setup, history, log, elapsed0
        self.t_start = self.t_logged = time.perf_counter()
        self.steps_logged = start
        self.param_norm = jax.jit(optax.tree.norm)
        data = setup.data
        self.batch_size = getattr(data, "batch_size", 0) if data is not None else 0

    def totals(self) -> RunTotals:
        """The run's totals now: its elapsed seconds, earlier sessions included."""
        return RunTotals(self.elapsed0 + time.perf_counter() - self.t_start, 0)

    def __call__(self, step: int, state: TrainState) -> Optional[dict]:
        """Evaluates and logs step `step` if due; the logged metrics, or None when the step is not logged."""
        setup, log_every = self.setup, self.setup.options.log_every
        evaluate = step in setup.eval_steps
        if not (evaluate or step % log_every == 0 or step == setup.num_steps):
            return None
        now = time.perf_counter()
        logged = {"elapsed_s": self.elapsed0 + now - self.t_start}
        if step > 0:
            window = slice(max(0, step - log_every), step)
            logged.update({f"train/{k}": float(np.mean(self.history["train"][k][window])) for k in TRAIN_KEYS})
            logged["train/param_norm"] = float(self.param_norm(state.params))
        if step > self.steps_logged:
            rate = (step - self.steps_logged) / max(now - self.t_logged, 1e-9)
            logged["train/steps_per_s"] = rate
            if self.batch_size:
                logged["train/examples_per_s"] = rate * self.batch_size
                logged["train/examples_per_s_per_device"] = rate * self.batch_size / setup.num_devices
        if step == 0:
            logged["model/num_params"], logged["model/param_bytes"] = param_count(state.params)
        if evaluate:
            results = setup.evaluator(state.params, state.model_state, state.ema_params)
            row = setup.eval_steps.index(step)
            for name, value in results.items():
                self.history["eval"][name][row] = value
            logged.update(results)
        self.log.write(step, logged)
        self.t_logged, self.steps_logged = time.perf_counter(), step
        return logged


def _result(setup: TrainingSetup, state: TrainState, history: dict) -> TrainResult:
    """The TrainResult of a finished run from its final state and histories."""
    evaluator, evals = setup.evaluator, history["eval"]
    first_loss = f"{EVAL_PREFIX}/{evaluator.evaluations[0].label}/loss" if evaluator else ""
    final = lambda name: float(evals[name][-1]) if name in evals else float("nan")
    ema_loss = final(first_loss.replace(EVAL_PREFIX, EMA_PREFIX, 1)) if setup.ema_decay is not None else None
    return TrainResult(state, history["train"]["loss"], final(first_loss), ema_loss, history["train"]["grad_norm"],
                       np.asarray(setup.eval_steps, np.int64), evals)

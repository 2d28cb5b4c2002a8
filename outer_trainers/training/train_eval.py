"""Evaluation while training one model: which splits/tasks, which metrics, at which steps.

    evaluator = Evaluator([Evaluation("test"), Evaluation("outer_valid", num_batches=4)], task, data, key)
    evaluator(params, model_state)          # {"eval/test/loss": ..., "eval/test/accuracy": ..., ...}
    evaluator(params, model_state, ema)     # the same plus "eval_ema/test/loss", ...
    evaluation_steps(1000, eval_every=250, eval_at=(10,))   # [10, 250, 500, 750, 1000]
    EvalPlan(every=250, evals=["test", "outer_valid"])   # what `train_loop(..., evaluation=...)` evaluates, when

Every Evaluation averages its metrics over the same batches at every step (its key is fixed), so
curves compare across steps. The metrics of a Task are its loss and, for an image classifier
(`is_image_classifier`: a `logits` method and batches of "image" and "label", as the built-in
ImageMLPTask and ConvTask have), its accuracy (`default_metrics`); a flax/haiku model's are
its loss and, when its outputs are logits over the data's classes, the accuracy (`model_metrics`,
which also turns metrics on model outputs, `fn(outputs, batch)` like a `loss_fn`, into metrics of
params). The last evaluation step is always the last training step.
"""
from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Mapping, Optional, Sequence, Union

import jax

from outer_trainers.runs.checkpoint_files import structure_of
from outer_trainers.training.train_state import Metric, as_task, mean_over_batches
from tasks.base import Task, accuracy

EVAL_PREFIX, EMA_PREFIX = "eval", "eval_ema"


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """One evaluation of the trained params: metrics averaged over batches of a split.

    Attributes:
        split: the data split evaluated (e.g. "test", "outer_valid").
        name: its label: its metrics are logged as "eval/<name>/<metric>" (default: `split`).
        task: the Task evaluated (default: the trained one); its params must have the trained params'
            structure (e.g. the same model on other data).
        data: the DataSource its batches come from (default: `task`'s data, else the trained data).
        num_batches: batches averaged over (>= 1).
        metrics: {name: metric(params, model_state, key, batch) -> scalar} added to the defaults (None: none).
    """
    split: str = "test"
    name: Optional[str] = None
    task: Optional[Task] = None
    data: Any = None
    num_batches: int = 8
    metrics: Optional[Mapping[str, Metric]] = None

    @property
    def label(self) -> str:
        """The name its metrics are logged under: `name`, or `split` when no name is given."""
        return self.name or self.split


@dataclasses.dataclass(frozen=True)
class EvalPlan:
    """What a model's training run evaluates, and when: `train_loop(..., evaluation=EvalPlan(every=500))`.

    In gin (scripts/train.py): `EvalPlan.every = 50`, `EvalPlan.evals = ("test", "outer_valid")`.
    The steps are checked against the run's length when the run is set up (`evaluation_steps`).

    Attributes:
        every: evaluate every this many steps (>= 1; None: only at `at` and the last step).
        at: further steps to evaluate at (0: before training).
        evals: the Evaluations, or split names (each `Evaluation(split, num_batches=batches)`), run at
            evaluation steps (None: one on `split`; empty: none).
        split: the split of the default evaluation.
        batches: batches the default evaluation, and each one given as a split name, averages over.
        metrics: metrics added to every evaluation: for a Task `fn(params, model_state, key, batch)`, for a
            model `fn(outputs, batch)` like its `loss_fn` (a classifier model gets "accuracy" without asking).
    """
    every: Optional[int] = None
    at: Sequence[int] = ()
    evals: Optional[Sequence[Union[Evaluation, str]]] = None
    split: str = "test"
    batches: int = 8
    metrics: Optional[Mapping[str, Any]] = None

    def __post_init__(self):
        object.__setattr__(self, "at", tuple(self.at))
        if self.evals is not None:
            object.__setattr__(self, "evals", tuple(self.evals))

    def evaluations(self) -> list[Evaluation]:
        """The Evaluations run at each evaluation step.

        Returns:
            `evals` with split names as `Evaluation(name, num_batches=batches)`, or
            `[Evaluation(split, num_batches=batches)]` when `evals` is None.
        """
        evals = (self.split,) if self.evals is None else self.evals
        return [Evaluation(e, num_batches=self.batches) if isinstance(e, str) else e for e in evals]


def evaluation_steps(num_steps: int, eval_every: Optional[int] = None, eval_at: Sequence[int] = ()) -> list[int]:
    """The steps (steps taken) at which a run of `num_steps` steps evaluates.

    {k · eval_every : 1 ≤ k, k · eval_every ≤ num_steps} ∪ eval_at ∪ {num_steps}.

    Args:
        num_steps: the run's length (>= 0); its last step always evaluates.
        eval_every: evaluate every this many steps (>= 1; None: only at `eval_at` and the end).
        eval_at: further steps to evaluate at, each in [0, num_steps] (0: before the first step).

    Returns:
        The steps, sorted, without repeats.
    """
    if eval_every is not None and eval_every < 1:
        raise ValueError(f"eval_every must be >= 1 (or None: evaluate only at eval_at and the end), got {eval_every}")
    bad = [s for s in eval_at if not 0 <= int(s) <= num_steps]
    if bad:
        raise ValueError(f"eval_at steps must lie in [0, num_steps={num_steps}], got {bad}")
    steps = {int(s) for s in eval_at} | {num_steps}
    if eval_every is not None:
        steps |= set(range(eval_every, num_steps + 1, eval_every))
    return sorted(steps)


def is_image_classifier(task: Task) -> bool:
    """Whether a Task classifies images the way the built-in ones do (ImageMLPTask, ConvTask).

    Decided by what the task offers, not by its class, so that this module depends on no
    concrete task: a `logits(params, images)` method (or `logits(params, images, model_state)`
    for a model with state such as BatchNorm) returning [batch, num_classes], and data whose
    train batches are mappings holding "image" and an integer class "label".

    Args:
        task: the Task.

    Returns:
        True when `default_metrics` can measure its accuracy.
    """
    data = getattr(task, "data", None)
    if not callable(getattr(task, "logits", None)) or data is None or "train" not in getattr(data, "splits", {}):
        return False
    spec = data.element_spec("train")
    return isinstance(spec, Mapping) and "image" in spec and "label" in spec


def default_metrics(task: Task) -> dict:
    """A Task's evaluation metrics: its loss, and its accuracy when it is an image classifier.

    accuracy = mean over the batch of [argmax_c logits(image)_c == label].

    Args:
        task: the Task.

    Returns:
        {"loss": metric} (+ "accuracy" when `is_image_classifier(task)`: the fraction of the batch's
        labels that are the argmax of its logits, BatchNorm with running statistics), each
        `metric(params, model_state, key, batch) -> scalar`.
    """
    metrics = {"loss": lambda p, ms, k, b: task.loss_with_state(p, ms, k, b)[0]}
    if is_image_classifier(task):
        takes_state = "model_state" in inspect.signature(task.logits).parameters
        logits = (lambda p, ms, b: task.logits(p, b["image"], ms)) if takes_state else (
            lambda p, ms, b: task.logits(p, b["image"]))
        metrics["accuracy"] = lambda p, ms, k, b: accuracy(logits(p, ms, b), b["label"])
    return metrics


def model_metrics(model: Any, data: Any, metrics: Optional[Mapping[str, Any]] = None, **adapter_kwargs) -> dict:
    """Metrics of a flax/haiku model's outputs as metrics of its params.

    Each `fn(outputs, batch) -> scalar` becomes `metric(params, model_state, key, batch)`: the
    model (through the same adapter as its Task, `as_task`) applied to the batch, then `fn`. When
    the data has classes and the outputs are [batch, num_classes] logits, "accuracy" is added.

    Args:
        model: a flax linen Module, an nnx constructor or a haiku function (as for `as_task`).
        data: its DataSource.
        metrics: {name: fn(outputs, batch) -> scalar} (None: only the automatic accuracy).
        **adapter_kwargs: passed to the adapter, as for the trained Task.

    Returns:
        {name: metric(params, model_state, key, batch) -> scalar}.
    """
    def of_outputs(fn):
        task = as_task(model, fn, data, **adapter_kwargs)
        return lambda p, ms, k, b: task.loss_with_state(p, ms, k, b)[0]

    out = {name: of_outputs(fn) for name, fn in (metrics or {}).items()}
    if data.num_classes and "accuracy" not in out and "label" in data.element_spec("train"):
        identity = as_task(model, lambda outputs, batch: outputs, data, **adapter_kwargs)
        params, model_state = jax.eval_shape(identity.init_with_state, jax.random.key(0))
        shape = jax.eval_shape(lambda p, ms, b: identity.loss_with_state(p, ms, jax.random.key(0), b)[0],
                               params, model_state, data.element_spec("train")).shape
        if tuple(shape) == (data.batch_size, data.num_classes):
            out["accuracy"] = of_outputs(lambda logits, batch: accuracy(logits, batch["label"]))
    return out


class Evaluator:
    """Runs every Evaluation on the params (and the EMA params) and names the results.

    Args:
        evaluations: the Evaluations, or split names (`Evaluation(split)`); labels must be unique.
        task: the trained Task (an Evaluation's default task).
        data: the trained DataSource (an Evaluation's default data when its task has none).
        key: the evaluation key: Evaluation i draws its batches from `fold_in(key, i)` at every call.
        metrics: metrics added to every Evaluation's defaults (e.g. `model_metrics(...)`), or None.
        placement: a sharding every Evaluation's own data is put on (match the params' under data parallelism),
            or None.
    """

    def __init__(self, evaluations: Sequence[Union[Evaluation, str]], task: Task, data: Any, key: jax.Array,
                 metrics: Optional[Mapping[str, Metric]] = None, placement: Any = None):
        self.evaluations = [Evaluation(e) if isinstance(e, str) else e for e in evaluations]
        labels = [e.label for e in self.evaluations]
        if len(set(labels)) != len(labels):
            raise ValueError(f"evaluation labels must be unique, got {labels}; give each Evaluation a name")
        params_structure = structure_of(jax.eval_shape(task.init, jax.random.key(0)))
        self._runs = []
        for i, ev in enumerate(self.evaluations):
            ev_task = ev.task or task
            ev_data = ev.data if ev.data is not None else (ev_task.data if ev.task is not None else data)
            if ev.num_batches < 1:
                raise ValueError(f"evaluation {ev.label!r}: num_batches must be >= 1, got {ev.num_batches}")
            if ev_data is not None and ev.split not in ev_data.splits:
                raise ValueError(f"evaluation {ev.label!r}: unknown split {ev.split!r}; data {ev_data.name!r} has "
                                 f"splits {sorted(ev_data.splits)}")
            if ev.task is not None:
                other = structure_of(jax.eval_shape(ev.task.init, jax.random.key(0)))
                if other != params_structure:
                    diff = [(o, p) for o, p in zip(other, params_structure) if o != p][:1] or (len(other),
                                                                                         len(params_structure))
                    raise ValueError(f"evaluation {ev.label!r}: its task's params differ in structure from the "
                                     f"trained model's (first difference, evaluated vs trained: {diff})")
            if placement is not None and ev_data is not None and ev_data is not data:
                ev_data = jax.device_put(ev_data, placement)
            fns = dict(default_metrics(ev_task), **(metrics or {}), **(ev.metrics or {}))
            self._runs.append((ev, fns, ev_data, jax.random.fold_in(key, i)))
        self._evaluate = jax.jit(self._evaluate_all)

    def _evaluate_all(self, params, model_state, ema_params, datas, keys):
        out = {}
        for prefix, p in ((EVAL_PREFIX, params), (EMA_PREFIX, ema_params)):
            for (ev, fns, *_), data, key in zip(self._runs, datas, keys) if p is not None else ():
                values = mean_over_batches(fns, p, model_state, data, key, ev.split, ev.num_batches)
                out.update({f"{prefix}/{ev.label}/{m}": v for m, v in values.items()})
        return out

    def metric_names(self, ema: bool = False) -> list[str]:
        """The names `__call__` returns: "eval/<label>/<metric>" (and "eval_ema/..." with `ema`), in order.

        Args:
            ema: include the EMA params' metrics.

        Returns:
            The metric names.
        """
        prefixes = (EVAL_PREFIX, EMA_PREFIX) if ema else (EVAL_PREFIX,)
        return [f"{prefix}/{ev.label}/{m}" for prefix in prefixes for ev, fns, *_ in self._runs for m in fns]

    def __call__(self, params: Any, model_state: Any, ema_params: Any = None) -> dict:
        """Every Evaluation's metrics of `params` (and of `ema_params`, with the same batches).

        Args:
            params: the trained params.
            model_state: their model state (also used with the EMA params).
            ema_params: the EMA params, or None.

        Returns:
            {"eval/<label>/<metric>": float} (+ {"eval_ema/<label>/<metric>": float} with `ema_params`).
        """
        datas, keys = [run[2] for run in self._runs], [run[3] for run in self._runs]
        out = jax.device_get(self._evaluate(params, model_state, ema_params, datas, keys))
        return {name: float(out[name]) for name in self.metric_names(ema_params is not None)}

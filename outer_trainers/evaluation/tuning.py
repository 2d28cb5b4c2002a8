"""Baselines tuned per task: the hand-designed optimizers, their learning-rate grids, and the tuning rule.

A baseline (`baseline`: Adam, AdamW, Muon, SGD with momentum) is trained at every learning rate of a
log-spaced grid (`default_lrs`: 7 rates half a decade apart) for every seed, all A rates x S seeds
in one vmapped, jitted program (`tune_learning_rate`), each run measuring its validation loss
after training in the same program (the "valids" of `task_trainer`'s run dict: the loss on the
validation split, `task_trainer.VALID_SPLIT` = "inner_valid", a split disjoint from train and
test). The best rate is `best_runs`'s: the lowest median over seeds of the final validation loss
v, a rate with a diverged seed (a non-finite train or validation loss) losing::

    score(lr) = median_seeds v(lr)   if every seed of lr is finite, else inf
    best      = argmin_lr score(lr)   (ties: the earlier rate)

This is how a user picks a rate: on held-out data, not on the loss being minimised (a rate chosen on
final train loss favours the one that over-fits). `best_runs(runs, by="train")` ranks by the final
train loss (`scores.final_loss`) instead, for callers that keep that rule.

While the best rate is the grid's smallest or largest, `extend_by` more rates are added past that
edge at the grid's spacing r = (lr_max / lr_min) ** (1 / (A - 1)) (at most `max_extensions`
times); a best rate still on an edge after that is reported (`grid_edge`). Test data never enters
tuning: the rule reads validation (or train) losses only.

The baselines, each with one tuned learning rate lr and everything else fixed:

    adam    optax.adam(lr)                                 (b1 0.9, b2 0.999, eps 1e-8)
    adamw   optax.adamw(lr, weight_decay=1e-2)             decoupled decay, scaled by lr as optax does
    muon    optax.contrib.muon(lr, muon_weight_dimension_numbers=muon_dimension_numbers)
            Newton-Schulz-orthogonalised Nesterov momentum (beta 0.95, 5 steps) for the weight
            matrices and kernels; Nesterov Adam (optax.adamw(nesterov=True), b1 0.9, b2 0.999, no
            weight decay) at the same lr for everything else
    sgdm    optax.sgd(lr, momentum=0.9)

`baselines.schedules.scheduled_baseline` builds the same optimizers with their rate on a schedule
over the task's step budget (constant, warm-up + cosine to 0, warm-up + linear decay to 0) and, for
AdamW and Muon, their weight decay wd as a tuned value: optax.adamw(sched, weight_decay=wd) decays
every parameter, optax.contrib.muon(sched, weight_decay=wd) the parameters on its Muon path
(matrices and kernels; its Adam path keeps no decay, as above). optax multiplies the decay by the
scheduled rate, so a step shrinks a weight by the fraction sched(t) wd. `default_weight_decays` is
the grid they are tuned over: 0 and the decades 1e-3 .. 1 (`DEFAULT_WEIGHT_DECAYS`). 1e-4 is left
out: at AdamW's rates (<= 0.1) over the suites' budgets (<= 2000 steps) it shrinks a weight by at
most lr wd T = 0.02, indistinguishable from no decay; the largest, 1, shrinks noticeably even in a
short run (lr wd T = 0.3 at lr 1e-3 over 300 steps). Adam and SGD with momentum take no decay
(their grid is (0,)). `baselines.grid_search.tune_baseline` tunes rate x decay x schedule.

Muon's routing (`muon_dimension_numbers`): a parameter of rank >= 2 is a weight of y = x W whose
last axis is the output, as haiku and flax lay out dense ([in, out]) and convolution ([k..., in,
out]) kernels, so it takes the Muon path with the last axis as the output axis and every other
axis as the reduction (fan-in) axes: a conv kernel is orthogonalised as the [k * in, out] matrix
it multiplies patches with, the way Muon's reference implementation treats convolution filters.
Embedding tables (a parameter whose path names "embed": haiku's `embed/embeddings`, a
`pos_embed`) are lookups, not matrix-vector products, and take the Adam path, as do vectors
(biases, norm scales) and scalars. optax's own default would send only rank-2 parameters, embedding
tables included, to Muon and every conv kernel to Adam. Muon and its Adam path share the one tuned
rate (optax's default), with optax's width scaling sqrt(max(1, fan_out / fan_in)) of the
orthogonalised update: on the smoke suite and two heldout-cpu tasks its best rate lay at 0.01-0.3,
inside the grid 1e-3..1.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from optax import contrib as optax_contrib

from outer_trainers.evaluation.scores import final_loss
from outer_trainers.evaluation.task_trainer import VALID_SPLIT, MakeTx, make_task_trainer, run_dict
from tasks.base import TaskFamily

_GRIDS = {"adam": (1e-4, 1e-1), "adamw": (1e-4, 1e-1), "muon": (1e-3, 1.0), "sgdm": (1e-3, 1.0)}
ADAMW_WEIGHT_DECAY = 1e-2
DEFAULT_WEIGHT_DECAYS = (0.0, 1e-3, 1e-2, 1e-1, 1.0)
DECAYED = ("adamw", "muon")


def baseline_names() -> list[str]:
    """The hand-designed baselines `baseline` builds: "adam", "adamw", "muon", "sgdm".

    Returns:
      the names.
    """
    return list(_GRIDS)


def muon_dimension_numbers(params: Any) -> Any:
    """Which parameters take Muon's orthogonalised path, and how each is read as a matrix (module docstring).

    Args:
      params: the parameter pytree (haiku or flax layout: a kernel's last axis is its output).

    Returns:
      the same tree with `optax.contrib.MuonDimensionNumbers(reduction_axis=(0 .. ndim - 2),
      output_axis=ndim - 1)` for each parameter of rank >= 2 whose path does not name "embed", and
      None (the Adam path) for the others.
    """
    def route(path, x):
        if jnp.ndim(x) < 2 or "embed" in jax.tree_util.keystr(path).lower():
            return None
        return optax_contrib.MuonDimensionNumbers(reduction_axis=tuple(range(jnp.ndim(x) - 1)),
                                                  output_axis=jnp.ndim(x) - 1)
    return jax.tree_util.tree_map_with_path(route, params)


def baseline(name: str, *, momentum: float = 0.9, weight_decay: float = ADAMW_WEIGHT_DECAY) -> MakeTx:
    """The optimizer of a baseline as a function of its (traced) learning rate.

    Args:
      name: "adam" (optax.adam), "adamw" (optax.adamw with `weight_decay`), "muon"
        (optax.contrib.muon routed by `muon_dimension_numbers`, its Adam path at the same rate) or
        "sgdm" (optax.sgd with `momentum`).
      momentum: SGD's momentum.
      weight_decay: AdamW's decoupled weight decay.

    Returns:
      `lr -> optax transform`.

    Raises:
      ValueError: an unknown name (the message lists the baselines), or "muon" with an optax too old for it.
    """
    if name == "adam":
        return optax.adam
    if name == "adamw":
        return lambda lr: optax.adamw(lr, weight_decay=weight_decay)
    if name == "muon":
        if not hasattr(optax_contrib, "MuonDimensionNumbers"):
            raise ValueError(f"the muon baseline needs an optax whose optax.contrib.muon takes "
                             f"muon_weight_dimension_numbers (tested with 0.2.8); this is optax {optax.__version__}")
        return lambda lr: optax_contrib.muon(lr, muon_weight_dimension_numbers=muon_dimension_numbers)
    if name == "sgdm":
        return lambda lr: optax.sgd(lr, momentum=momentum)
    raise ValueError(f"unknown baseline {name!r}; the baselines are {baseline_names()}")


def default_weight_decays(name: str) -> tuple[float, ...]:
    """A baseline's starting weight-decay grid: `DEFAULT_WEIGHT_DECAYS` for AdamW and Muon, (0,) for the others.

    Args:
      name: a baseline name.

    Returns:
      the decays, ascending.
    """
    if name not in _GRIDS:
        raise ValueError(f"unknown baseline {name!r}; the baselines are {baseline_names()}")
    return DEFAULT_WEIGHT_DECAYS if name in DECAYED else (0.0,)


def default_lrs(name: str, num: int = 7) -> tuple[float, ...]:
    """A baseline's starting grid: `num` log-spaced rates (half a decade apart for 7), 1e-4..1e-1 for
    Adam and AdamW, 1e-3..1 for Muon and SGD with momentum.

    lr_i = lo * (hi / lo) ** (i / (num - 1)), i = 0 .. num - 1.

    Args:
      name: a baseline name.
      num: the number of rates (>= 2).

    Returns:
      the rates, ascending.
    """
    if name not in _GRIDS:
        raise ValueError(f"unknown baseline {name!r}; the baselines are {baseline_names()}")
    lo, hi = _GRIDS[name]
    return tuple(float(x) for x in np.logspace(np.log10(lo), np.log10(hi), num))


def check_learning_rates(lrs: Sequence[float], what: str) -> list[float]:
    """The grid as floats, or ValueError naming `what` unless it is non-empty and every rate is finite and > 0.

    Args:
      lrs: the learning rates.
      what: the argument's name for the message, e.g. "evaluate: adam_lrs".

    Returns:
      the learning rates as a list of floats.
    """
    try:
        rates = [float(lr) for lr in lrs]
    except (TypeError, ValueError) as e:
        raise ValueError(f"{what} must be a sequence of learning rates, got {lrs!r} ({e})") from None
    if not rates or not all(np.isfinite(lr) and lr > 0 for lr in rates):
        raise ValueError(f"{what} must hold at least one learning rate, each finite and > 0, got {lrs!r}")
    return rates


def lr_grid(lrs: Sequence[float]) -> list[tuple[float, jax.Array]]:
    """A learning-rate grid as `run_settings` takes it, for make_tx = lr -> optimizer.

    Args:
      lrs: the learning rates, at least one, each finite and > 0.

    Returns:
      `[(lr, lr as a float32 scalar array)]`: the label and the traced tx_args of each point.
    """
    return [(lr, jnp.asarray(lr, jnp.float32)) for lr in check_learning_rates(lrs, "lr_grid")]


SELECT_BY = ("valid", "train")


def _tuning_score(run: dict, by: str) -> float:
    """Median over runs of the final validation (or train) loss; inf if any run is non-finite."""
    finals = final_loss(run["losses"])
    if by == "train":
        return float(np.median(finals)) if np.all(np.isfinite(finals)) else float("inf")
    if "valids" not in run:
        raise ValueError(f"best_runs: a run of {run.get('optimizer')!r} has no validation losses (\"valids\"); "
                         f"train it with a validation split (task_trainer.run_settings, run_fixed, "
                         f"tune_learning_rate) or rank by the train loss with by='train'")
    valids = np.asarray(run["valids"], np.float64)
    ok = np.all(np.isfinite(finals)) and np.all(np.isfinite(valids))
    return float(np.median(valids)) if ok else float("inf")


def best_runs(runs: Sequence[dict], by: str = "valid") -> dict[str, dict]:
    """Each optimizer's best setting: the rule that tunes a baseline's learning rate.

    A setting's score is the median, over its runs (tasks or seeds), of the final validation
    loss ("valids", measured after training on the validation split); a setting with any
    non-finite (diverged) run, train or validation loss, loses. Lowest score wins; ties go to the
    earlier setting. The median keeps one hard task draw from deciding the grid point; the
    validation split keeps test data out of tuning. With `by="train"` the score is the final train
    loss (`final_loss`: mean of the last 10% of steps) instead. No winner is named silently: when
    every setting of an optimizer diverged, its entry is its first setting marked
    `"diverged": True` (a copy; reports must say so).

    Args:
      runs: run dicts (`task_trainer`'s module docstring) with "optimizer", "losses" [runs,
        num_steps] and, for `by="valid"`, "valids" [runs].
      by: "valid" (the protocol's rule) or "train".

    Returns:
      `{optimizer name: its best run}`, in the order the names first appear in `runs`; a run
      of an optimizer whose every setting diverged has `"diverged": True`.

    Raises:
      ValueError: an unknown `by`, or `by="valid"` and a run without "valids".
    """
    if by not in SELECT_BY:
        raise ValueError(f"best_runs: by must be one of {SELECT_BY}, got {by!r}")
    best, scores = {}, {}
    for r in runs:
        name, score = r["optimizer"], _tuning_score(r, by)
        if name not in best or score < scores[name]:
            best[name], scores[name] = r, score
    return {name: r if np.isfinite(scores[name]) else {**r, "diverged": True} for name, r in best.items()}


def grid_edge(runs: Sequence[dict], name: str, by: str = "valid") -> Optional[str]:
    """Whether `name`'s best rate among `runs` is on the edge of the rates tried.

    Args:
      runs: run dicts ("optimizer", "learning_rate", "losses", "valids"), e.g. `tune_learning_rate`'s.
      name: the optimizer whose rates are looked at.
      by: `best_runs`' rule.

    Returns:
      "low" or "high" when the best rate is the smallest or largest tried (every rate diverged
      counts as "low": smaller rates are where to look), else None (also for a single rate); for
      runs of `grid_search.tune_baseline`, the best run's own "grid_edge" (its edges on the rate and
      decay axes of the whole grid: "low", "high", "decay high", ... joined by ", ").
    """
    own = [r for r in runs if r["optimizer"] == name]
    lrs = sorted(r["learning_rate"] for r in own)
    best = best_runs(own, by)[name]
    if best.get("diverged"):
        return "low"
    if "grid_edge" in best:  # tuned by grid_search.tune_baseline: the edge of its whole grid
        return best["grid_edge"]
    if len(lrs) < 2:
        return None
    return "low" if best["learning_rate"] == lrs[0] else "high" if best["learning_rate"] == lrs[-1] else None


def _to_runs(name: str, lrs: Sequence[float], out: dict, num_steps: int, valid_points: int) -> list[dict]:
    """Run dicts (float64) of a batched trainer's outputs [A, S, ...], one per rate of `lrs`."""
    out = jax.device_get(out)
    return [run_dict(name, lr, {k: v[i] for k, v in out.items()}, num_steps, valid_points)
            for i, lr in enumerate(lrs)]


def tune_learning_rate(family: TaskFamily, name: str, make_tx: MakeTx, lrs: Sequence[float], cfgs: Any,
                       keys: jax.Array, num_steps: int, *, eval_split: str = "test", eval_batches: int = 8,
                       extend_by: int = 2, max_extensions: int = 4, sequential: bool = False,
                       valid_split: str = VALID_SPLIT, valid_points: int = 1, select_by: str = "valid") -> list[dict]:
    """Trains every seed at every rate of a log-spaced grid, extending the grid while its best rate is on an edge.

    Each extension adds lr_edge * r ** k (k = 1 .. extend_by) past the edge holding the best rate,
    r the grid's spacing (its inverse at the low edge), as in the module docstring.

    Args:
      family: the task family `cfgs` were drawn from.
      name: the optimizer's name in the runs.
      make_tx: lr (a traced float32 scalar) -> the optax transform.
      lrs: the starting grid (>= 2 rates to be extendable; its spacing is the geometric mean ratio
        of neighbouring rates).
      cfgs: S task cfgs (one per seed).
      keys: S run keys.
      num_steps: training steps per run.
      eval_split: the data split of the held-out loss after training.
      eval_batches: batches averaged for that loss.
      extend_by: rates added past the edge per extension.
      max_extensions: the most extensions (0: the grid as given).
      sequential: run the rates and seeds one after another in the program (`make_task_trainer`).
      valid_split: the validation split, measured in the same program as the training.
      valid_points: validation measurements per run (`task_trainer.valid_schedule`).
      select_by: `best_runs`' rule for the grid extensions ("valid", or "train").

    Returns:
      run dicts (`task_trainer`'s module docstring: "losses" [S, num_steps], "evals", "valids" [S],
      "valid_curve" [S, K], ...; float64), one per rate tried, ascending in rate; `best_runs` picks
      the best, `grid_edge` says whether it is still on an edge.
    """
    rates = sorted(check_learning_rates(lrs, f"tune_learning_rate({name}): lrs"))
    trainer = make_task_trainer(family, make_tx, num_steps, eval_split=eval_split, eval_batches=eval_batches,
                                batched_args=True, sequential=sequential, valid_split=valid_split,
                                valid_points=valid_points)

    def run(points):
        return _to_runs(name, points, trainer(np.asarray(points, np.float32), cfgs, keys, family.data), num_steps,
                        valid_points)

    runs = run(rates)
    if len(rates) < 2:
        return runs
    step = (rates[-1] / rates[0]) ** (1.0 / (len(rates) - 1))
    for _ in range(max_extensions):
        edge = grid_edge(runs, name, select_by)
        if edge is None:
            break
        tried = [r["learning_rate"] for r in runs]
        start = min(tried) if edge == "low" else max(tried)
        factor = 1.0 / step if edge == "low" else step
        runs = sorted(runs + run([start * factor ** k for k in range(1, extend_by + 1)]),
                      key=lambda r: r["learning_rate"])
    return runs

"""The evaluation protocol: baselines tuned per task, and how an optimizer is scored against them.

Tuning (`tune_learning_rate`). A baseline is trained at every learning rate of a log-spaced grid
for every seed, all A rates x S seeds in one vmapped, jitted program. The best rate is
`evaluation.best_runs`'s: the lowest median over seeds of the final train loss (a rate with a
diverged seed loses). While the best rate is the grid's smallest or largest, `extend_by` more
rates are added past that edge at the grid's spacing (at most `max_extensions` times); a best rate
still on an edge after that is reported (`grid_edge`). Test data never enters tuning.

Scores of an optimizer L against a tuned baseline B on one task of T steps (`compare_runs`),
every statistic a median over seeds::

    final train loss   f = mean train loss over the last w = max(1, T // 10) steps (`final_loss`)
    held-out loss      e = mean loss over batches of the task's eval split after training
    ratios             f_L / f_B  and  e_L / e_B                  (< 1: L is better)
    smoothed curve     c(t) = mean of the train losses of steps t-w+1 .. t, for t >= w (1-based)
    time to reach      t_L = the first step t with median_seeds c_L(t) <= f_B  (the baseline's final loss)
    speedup            T / t_L  when L reaches f_B within T steps;  otherwise t_B / T, where t_B is the
                       first step at which the baseline's curve reaches f_L (so speedup < 1 means L is slower)

The curve is the same trailing mean that defines the final loss, so c_B(T) = f_B and a single lucky
minibatch cannot "reach" a target. A run with a non-finite train or held-out loss on any seed is
diverged: a diverged L scores ratio inf and speedup 0 (and is reported as diverged, not as a
number); a baseline whose every rate diverged scores ratio 0 and speedup inf for L.

Across tasks (`summarize`): wins per metric (f_L < f_B, e_L < e_B, speedup > 1) and the
interquartile mean (`iqm`) of each ratio and of the speedups.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from outer_trainers.evaluation.comparison import best_runs, check_learning_rates, final_loss, make_task_trainer
from tasks.base import TaskFamily

__all__ = ["baseline", "baseline_names", "default_lrs", "tune_learning_rate", "run_fixed", "grid_edge", "smoothed",
           "steps_to_reach", "diverged", "stability", "compare_runs", "iqm", "summarize"]

MakeTx = Callable[[Any], optax.GradientTransformation]
_GRIDS = {"adam": (1e-4, 1e-1), "adamw": (1e-4, 1e-1), "sgdm": (1e-3, 1.0)}


def baseline_names() -> list[str]:
    """The hand-designed baselines `baseline` builds: "adam", "adamw", "sgdm".

    Returns:
      the names.
    """
    return list(_GRIDS)


def baseline(name: str, *, momentum: float = 0.9, weight_decay: float = 1e-2) -> MakeTx:
    """The optimizer of a baseline as a function of its (traced) learning rate.

    Args:
      name: "adam" (optax.adam), "adamw" (optax.adamw with `weight_decay`) or "sgdm" (optax.sgd
        with `momentum`).
      momentum: SGD's momentum.
      weight_decay: AdamW's decoupled weight decay.

    Returns:
      `lr -> optax transform`.

    Raises:
      ValueError: an unknown name (the message lists the baselines).
    """
    if name == "adam":
        return optax.adam
    if name == "adamw":
        return lambda lr: optax.adamw(lr, weight_decay=weight_decay)
    if name == "sgdm":
        return lambda lr: optax.sgd(lr, momentum=momentum)
    raise ValueError(f"unknown baseline {name!r}; the baselines are {baseline_names()}")


def default_lrs(name: str, num: int = 7) -> tuple[float, ...]:
    """A baseline's starting grid: `num` log-spaced rates (half a decade apart for 7), 1e-4..1e-1 for
    Adam and AdamW, 1e-3..1 for SGD with momentum.

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


def _to_runs(name: str, lrs: Sequence[float], losses, evals) -> list[dict]:
    losses, evals = np.asarray(losses, np.float64), np.asarray(evals, np.float64)
    return [{"optimizer": name, "learning_rate": float(lr), "losses": losses[i], "evals": evals[i]}
            for i, lr in enumerate(lrs)]


def grid_edge(runs: Sequence[dict], name: str) -> Optional[str]:
    """Whether `name`'s best rate among `runs` is on the edge of the rates tried.

    Args:
      runs: run dicts ("optimizer", "learning_rate", "losses"), e.g. `tune_learning_rate`'s.
      name: the optimizer whose rates are looked at.

    Returns:
      "low" or "high" when the best rate is the smallest or largest tried (every rate diverged
      counts as "low": smaller rates are where to look), else None (also for a single rate).
    """
    own = [r for r in runs if r["optimizer"] == name]
    lrs = sorted(r["learning_rate"] for r in own)
    best = best_runs(own)[name]
    if best.get("diverged"):
        return "low"
    if len(lrs) < 2:
        return None
    return "low" if best["learning_rate"] == lrs[0] else "high" if best["learning_rate"] == lrs[-1] else None


def tune_learning_rate(family: TaskFamily, name: str, make_tx: MakeTx, lrs: Sequence[float], cfgs: Any,
                       keys: jax.Array, num_steps: int, *, eval_split: str = "test", eval_batches: int = 8,
                       extend_by: int = 2, max_extensions: int = 4, sequential: bool = False) -> list[dict]:
    """Trains every seed at every rate of a log-spaced grid, extending the grid while its best rate is on an edge.

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

    Returns:
      `[{"optimizer": name, "learning_rate", "losses" [S, num_steps], "evals" [S]}]` (float64),
      one per rate tried, ascending in rate; `best_runs` picks the best, `grid_edge` says whether
      it is still on an edge.
    """
    rates = sorted(check_learning_rates(lrs, f"tune_learning_rate({name}): lrs"))
    trainer = make_task_trainer(family, make_tx, num_steps, eval_split=eval_split, eval_batches=eval_batches,
                                batched_args=True, sequential=sequential)

    def run(points):
        out = jax.device_get(trainer(np.asarray(points, np.float32), cfgs, keys, family.data))
        return _to_runs(name, points, *out)

    runs = run(rates)
    if len(rates) < 2:
        return runs
    step = (rates[-1] / rates[0]) ** (1.0 / (len(rates) - 1))
    for _ in range(max_extensions):
        edge = grid_edge(runs, name)
        if edge is None:
            break
        tried = [r["learning_rate"] for r in runs]
        start = min(tried) if edge == "low" else max(tried)
        factor = 1.0 / step if edge == "low" else step
        runs = sorted(runs + run([start * factor ** k for k in range(1, extend_by + 1)]),
                      key=lambda r: r["learning_rate"])
    return runs


def run_fixed(family: TaskFamily, name: str, make_tx: MakeTx, tx_args: Any, cfgs: Any, keys: jax.Array,
              num_steps: int, *, eval_split: str = "test", eval_batches: int = 8, sequential: bool = False) -> dict:
    """Trains every seed with one optimizer setting (a learned optimizer's theta): one program.

    Args:
      family: the task family `cfgs` were drawn from.
      name: the optimizer's name in the run.
      make_tx: tx_args -> the optax transform.
      tx_args: its argument (traced), e.g. theta.
      cfgs: S task cfgs.
      keys: S run keys.
      num_steps: training steps per run.
      eval_split: the data split of the held-out loss after training.
      eval_batches: batches averaged for that loss.
      sequential: run the seeds one after another in the program (`make_task_trainer`).

    Returns:
      `{"optimizer": name, "learning_rate": nan, "losses" [S, num_steps], "evals" [S]}` (float64).
    """
    trainer = make_task_trainer(family, make_tx, num_steps, eval_split=eval_split, eval_batches=eval_batches,
                                sequential=sequential)
    losses, evals = jax.device_get(trainer(tx_args, cfgs, keys, family.data))
    return _to_runs(name, [float("nan")], np.asarray(losses)[None], np.asarray(evals)[None])[0]


def smoothed(losses, window: Optional[int] = None) -> np.ndarray:
    """The trailing-mean train-loss curve c(t) of the module docstring.

    Args:
      losses: per-step train losses [..., T].
      window: w (default max(1, T // 10), the window of `final_loss`).

    Returns:
      [..., T]: entry t-1 is the mean of steps t-w+1 .. t for t >= w, NaN before.
    """
    losses = np.asarray(losses, np.float64)
    t = losses.shape[-1]
    w = max(1, t // 10) if window is None else int(window)
    csum = np.cumsum(np.concatenate([np.zeros(losses.shape[:-1] + (1,)), losses], axis=-1), axis=-1)
    out = np.full(losses.shape, np.nan)
    out[..., w - 1:] = (csum[..., w:] - csum[..., :-w]) / w
    return out


def steps_to_reach(losses, target: float) -> Optional[int]:
    """The first step (1-based) at which the median over seeds of the smoothed curve is <= `target`.

    Args:
      losses: train losses [S, T].
      target: the loss to reach.

    Returns:
      the step, or None when it is never reached within T steps.
    """
    curve = np.median(smoothed(losses), axis=0)
    hit = np.nonzero(np.isfinite(curve) & (curve <= target))[0]
    return int(hit[0]) + 1 if hit.size else None


def diverged(run: dict) -> bool:
    """Whether any seed of a run has a non-finite train or held-out loss.

    Args:
      run: a run dict ("losses" [S, T], "evals" [S]).

    Returns:
      True when the run diverged.
    """
    return bool(not np.all(np.isfinite(run["losses"])) or not np.all(np.isfinite(run["evals"])))


def stability(run: dict) -> dict:
    """Whether each seed of a (long) run stayed finite and ended below where it started.

    A seed passes when every train loss and its held-out loss are finite and its final train loss
    (mean of the last 10% of steps, `final_loss`) is below its initial one (mean of the first 1%,
    at least one step): the "never diverges" check of a learned optimizer run past its
    meta-training horizon.

    Args:
      run: a run dict ("losses" [S, T], "evals" [S]).

    Returns:
      `{"initial", "final", "max", "eval": [S] float lists (possibly non-finite; "max" skips NaN steps),
      "ok": [S] bools, "all_ok": bool}`.
    """
    losses = np.asarray(run["losses"], np.float64)
    evals = np.asarray(run["evals"], np.float64)
    head = max(1, losses.shape[-1] // 100)
    initial = losses[:, :head].mean(axis=-1)
    final = final_loss(losses)
    finite = np.all(np.isfinite(losses), axis=-1) & np.isfinite(evals)
    ok = finite & (final < initial)
    peak = [float(row[~np.isnan(row)].max()) if not np.isnan(row).all() else float("nan") for row in losses]
    return {"initial": initial.tolist(), "final": final.tolist(), "max": peak, "eval": evals.tolist(),
            "ok": ok.tolist(), "all_ok": bool(ok.all())}


def compare_runs(run: dict, base: dict) -> dict:
    """Scores an optimizer's run against a tuned baseline's best run on one task (module docstring).

    Args:
      run: the optimizer's run: "losses" [S, T], "evals" [S].
      base: the baseline's best run (`best_runs`; "diverged": True when every rate diverged), same seeds.

    Returns:
      `{"final_train", "baseline_final_train", "ratio_train", "eval", "baseline_eval", "ratio_eval",
      "initial_train", "below_initial", "steps_to_reach" (None: never), "baseline_steps_to_reach"
      (of the optimizer's final loss; None unless needed), "speedup", "diverged",
      "baseline_diverged", "win_train", "win_eval", "win_speed"}`: medians over seeds, floats.
    """
    t = run["losses"].shape[-1]
    f_l, e_l = float(np.median(final_loss(run["losses"]))), float(np.median(run["evals"]))
    f_b, e_b = float(np.median(final_loss(base["losses"]))), float(np.median(base["evals"]))
    initial = float(np.median(run["losses"][:, 0]))
    out = {"final_train": f_l, "baseline_final_train": f_b, "eval": e_l, "baseline_eval": e_b,
           "initial_train": initial, "below_initial": bool(np.isfinite(f_l) and f_l < initial),
           "steps_to_reach": None, "baseline_steps_to_reach": None, "diverged": diverged(run),
           "baseline_diverged": bool(base.get("diverged", False) or diverged(base))}
    if out["diverged"]:
        out.update(ratio_train=math.inf, ratio_eval=math.inf, speedup=0.0)
    elif out["baseline_diverged"]:
        out.update(ratio_train=0.0, ratio_eval=0.0, speedup=math.inf)
    else:
        out.update(ratio_train=f_l / f_b, ratio_eval=e_l / e_b)
        out["steps_to_reach"] = steps_to_reach(run["losses"], f_b)
        if out["steps_to_reach"] is not None:
            out["speedup"] = t / out["steps_to_reach"]
        else:
            out["baseline_steps_to_reach"] = steps_to_reach(base["losses"], f_l) or t
            out["speedup"] = out["baseline_steps_to_reach"] / t
    out["win_train"] = bool(not out["diverged"] and out["ratio_train"] < 1.0)
    out["win_eval"] = bool(not out["diverged"] and out["ratio_eval"] < 1.0)
    out["win_speed"] = bool(not out["diverged"] and out["speedup"] > 1.0)
    return out


def iqm(values: Sequence[float]) -> float:
    """The interquartile mean: the mean of the middle 50% of the sorted values.

    With n values, floor(n / 4) are dropped from each end (none for n < 4, so it is the plain mean
    there); tied values are kept or dropped by position alone. Infinite values sort to the ends
    (a diverged task's inf ratio is dropped only if at most floor(n / 4) tasks diverged); NaN is
    refused.

    Args:
      values: the per-task ratios or speedups (at least one).

    Returns:
      the IQM (inf when an infinite value survives the trimming).
    """
    v = np.sort(np.asarray(values, np.float64))
    if v.size == 0 or np.any(np.isnan(v)):
        raise ValueError(f"iqm needs at least one value and no NaN, got {list(values)}")
    k = v.size // 4
    return float(np.mean(v[k:v.size - k]))


def summarize(comparisons: dict) -> dict:
    """Aggregates `compare_runs` results over the tasks of a suite.

    Args:
      comparisons: `{task name: compare_runs(...)}` for one optimizer against one baseline.

    Returns:
      `{"num_tasks", "wins_train", "wins_eval", "wins_speed", "iqm_ratio_train", "iqm_ratio_eval",
      "iqm_speedup", "diverged" (task names), "not_below_initial" (task names)}`.
    """
    c = list(comparisons.values())
    return {"num_tasks": len(c),
            "wins_train": sum(x["win_train"] for x in c), "wins_eval": sum(x["win_eval"] for x in c),
            "wins_speed": sum(x["win_speed"] for x in c),
            "iqm_ratio_train": iqm([x["ratio_train"] for x in c]), "iqm_ratio_eval": iqm([x["ratio_eval"] for x in c]),
            "iqm_speedup": iqm([x["speedup"] for x in c]),
            "diverged": [t for t, x in comparisons.items() if x["diverged"]],
            "not_below_initial": [t for t, x in comparisons.items() if not x["below_initial"]]}

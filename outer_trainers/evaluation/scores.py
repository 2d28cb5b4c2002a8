"""How an optimizer's runs are scored against a tuned baseline's, per task and across tasks.

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
diverged (`diverged`): a diverged L scores ratio inf and speedup 0 (and is reported as diverged,
not as a number); a baseline whose every rate diverged scores ratio 0 and speedup inf for L.

Across tasks (`summarize`): wins per metric (f_L < f_B, e_L < e_B, speedup > 1) and the
interquartile mean (`iqm`) of each ratio and of the speedups. `stability` is the pass/fail check
of one long run (finite, and ending below where it started).

Every function takes run dicts (`task_trainer`'s module docstring) and returns plain numbers.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np


def final_loss(losses) -> np.ndarray:
    """The "final" loss of training curves: the mean of the last 10% of steps (at least one).

    f = mean(losses[..., T - w:]) with w = max(1, T // 10) for curves of T steps.

    Args:
      losses: per-step losses [..., num_steps].

    Returns:
      numpy array [...].
    """
    losses = np.asarray(losses)
    tail = max(1, losses.shape[-1] // 10)
    return np.mean(losses[..., -tail:], axis=-1)


def smoothed(losses, window: Optional[int] = None) -> np.ndarray:
    """The trailing-mean train-loss curve c(t) of the module docstring.

    c(t) = (1 / w) * sum_{s = t-w+1}^{t} loss(s), for 1-based steps t >= w.

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

    t = min { t : median_seeds c(t) <= target }, c the `smoothed` curve.

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

    With the n values sorted, s[1] <= ... <= s[n], and k = floor(n / 4): IQM = mean(s[k+1 .. n-k]),
    none dropped for n < 4 (the plain mean there); tied values are kept or dropped by position alone.
    Infinite values sort to the ends (a diverged task's inf ratio is dropped only if at most
    floor(n / 4) tasks diverged); NaN is refused.

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

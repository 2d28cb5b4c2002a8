"""Scores across the tasks of a suite: interquartile means, their bootstrap intervals, performance profiles.

    s = summarize(comparisons, runs)        # wins, IQMs and 95% intervals of one optimizer vs one baseline
    p = performance_profile(results)        # every optimizer's loss ratio to the best one, per task

**IQM.** The interquartile mean of n per-task values (`iqm`): with the values sorted, s[1] <= ... <=
s[n], and k = floor(n / 4), IQM = mean(s[k+1 .. n-k]) (the plain mean for n < 4). An infinite value
(a diverged task) survives the trimming when more than k tasks are infinite, and then the IQM is inf.

**Intervals** (`iqm_interval`, Agarwal et al. 2021's stratified bootstrap, computed by
`scipy.stats.bootstrap`). The tasks are the strata: each resample draws, within every task
independently, as many seeds as it has with replacement (the optimizer's and the baseline's runs of a
seed stay paired: they share the task draw and initialisation), recomputes each task's score from
those seeds exactly as `scores.compare_runs` does (medians over the drawn seeds), and takes the IQM
across tasks. The interval is the percentile interval of 2000 resamples (95%: the 2.5th and 97.5th
percentiles; percentiles are taken of x / (1 + |x|), a monotone map, so an infinite IQM is a bound
like any other). A task with one seed, or on which either side diverged, keeps its score in every
resample. With 2-3 seeds per task an interval says how much the seeds that happened to be drawn
move the IQM; it is no substitute for more seeds. A percentile interval need not contain the point
estimate when the scores are very skewed.

**Performance profile** (Dolan and Moré 2002, as AlgoPerf uses them; `performance_profile`). On each
task, every optimizer and tuned baseline (at its validation-selected rate) has a test loss e after
training (median over seeds; inf when it diverged); r = e / min over optimizers of e
(`scores.loss_ratio`: 1 for the best). `by="train"` profiles the final train loss instead. An optimizer's
profile rho(tau) is the fraction of tasks with r <= tau: rho(1) is the fraction it wins (ties count
for all), and the curve that rises fastest is the most often near the best.
"""
from __future__ import annotations

import inspect
import math
import warnings
from typing import Optional, Sequence

import numpy as np
from scipy import stats

from outer_trainers.evaluation.scores import diverged, final_loss, first_reach, loss_ratio, smoothed
from outer_trainers.evaluation.tuning import best_runs

METRICS = ("ratio_train", "ratio_eval", "speedup", "velodrome_ratio")  # the scores with an IQM and interval
N_RESAMPLES, CONFIDENCE = 2000, 0.95
_BATCH, _BATCH_BYTES = 100, 64 << 20  # resamples per vectorised call, fewer when a task's data x batch passes 64 MiB
_RNG = "rng" if "rng" in inspect.signature(stats.bootstrap).parameters else "random_state"  # scipy < 1.15


def iqm(values: Sequence[float]) -> float:
    """The interquartile mean: the mean of the middle 50% of the sorted values (module docstring).

    Ties are kept or dropped by position alone; NaN is refused.

    Args:
      values: the per-task ratios or speedups (at least one).

    Returns:
      the IQM (inf when an infinite value survives the trimming).
    """
    v = np.asarray(values, np.float64)
    if v.size == 0 or np.any(np.isnan(v)):
        raise ValueError(f"iqm needs at least one value and no NaN, got {list(values)}")
    return float(_iqm_rows(v[None])[0])


def _iqm_rows(v: np.ndarray) -> np.ndarray:
    """The IQM of each row of [B, n] values (NaN stays NaN)."""
    v = np.sort(v, axis=-1)
    k = v.shape[-1] // 4
    with np.errstate(invalid="ignore"):
        return np.mean(v[:, k:v.shape[-1] - k], axis=-1)


def iqm_interval(strata: Sequence, *, confidence_level: float = CONFIDENCE, n_resamples: int = N_RESAMPLES,
                 seed: int = 0) -> dict:
    """The IQM across tasks of a per-task score and its stratified-bootstrap percentile interval.

    Args:
      strata: one per task: `(data, score)`, data [S, ...] the task's per-seed values and `score`
        mapping seed-resampled data [B, S, ...] to the task's score [B], symmetric in the seeds (each
        distinct multiset of drawn seeds is scored once); or a number (a fixed score).
      confidence_level: the interval's coverage.
      n_resamples: bootstrap resamples.
      seed: the resampling's random seed (the same seed, the same interval).

    Returns:
      `{"iqm", "ci_low", "ci_high"}`: the IQM of the scores on all the seeds, and the interval's bounds.
    """
    fixed, varying = [], []
    for s in strata:
        if isinstance(s, tuple) and len(s[0]) > 1:
            varying.append((np.asarray(s[0]), s[1]))
        else:
            fixed.append(float(s) if not isinstance(s, tuple) else float(s[1](np.asarray(s[0])[None])[0]))
    point = [float(score(data[None])[0]) for data, score in varying]
    estimate = iqm(fixed + point)
    if not varying:
        return {"iqm": estimate, "ci_low": estimate, "ci_high": estimate}

    def rescore(ix, data, score):  # a score depends on the multiset of drawn seeds only: score each one once
        draws, back = np.unique(np.sort(np.asarray(ix, int).reshape(-1, ix.shape[-1]), axis=-1), axis=0,
                                return_inverse=True)
        return np.asarray(score(data[draws]), np.float64)[back.reshape(-1)]

    def statistic(*indices, axis=-1):
        lead = indices[0].shape[:-1]
        cols = [rescore(ix, data, score) for ix, (data, score) in zip(indices, varying)]
        rows = np.concatenate([np.broadcast_to(np.asarray(fixed, np.float64), (cols[0].shape[0], len(fixed))),
                               np.stack(cols, axis=-1)], axis=-1)
        value = _iqm_rows(rows)
        return (value / (1.0 + np.abs(value))).reshape(lead)  # inf -> 1: percentiles stay finite

    batch = max(1, min(_BATCH, _BATCH_BYTES // max(data.nbytes for data, _ in varying)))  # long curves, many seeds
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)  # the standard error of a distribution holding 1.0 (inf)
        res = stats.bootstrap(tuple(np.arange(len(d), dtype=np.float64) for d, _ in varying), statistic,
                              n_resamples=n_resamples, batch=batch, vectorized=True, axis=-1,
                              confidence_level=confidence_level, method="percentile",
                              **{_RNG: np.random.default_rng(seed)})
    back = lambda y: float(y / (1.0 - abs(y))) if abs(y) < 1.0 else math.copysign(math.inf, y)
    return {"iqm": estimate, "ci_low": back(float(res.confidence_interval.low)),
            "ci_high": back(float(res.confidence_interval.high))}


def _median(x: np.ndarray) -> np.ndarray:
    """The median over the seed axis (1) of resampled data [B, S, ...], equal to np.median's.

    Sorting the few seeds and averaging the middle two is several times faster than np.median over a
    non-last axis; data holding a NaN takes np.median's path (NaN where np.median gives NaN).
    """
    if np.isnan(x).any():
        return np.median(x, axis=1)
    s, n = np.sort(x, axis=1), x.shape[1]
    return 0.5 * (s[:, (n - 1) // 2] + s[:, n // 2])


def pair_strata(run: dict, base: dict, comparison: dict) -> dict:
    """Each of `METRICS` of one task as a stratum of `iqm_interval`, re-scored as `compare_runs` scores it.

    Args:
      run: the optimizer's run ("losses" [S, T], "evals" [S]).
      base: the baseline's best run, same seeds.
      comparison: `compare_runs(run, base)` (its values are the fixed scores of a diverged task).

    Returns:
      `{metric: stratum}`.
    """
    if comparison["diverged"] or comparison["baseline_diverged"] or run["losses"].shape[0] < 2:
        return {m: comparison[m] for m in METRICS}
    t = run["losses"].shape[-1]
    f = np.stack([final_loss(run["losses"]), final_loss(base["losses"])], axis=-1)        # [S, 2]
    e = np.stack([np.asarray(run["evals"], np.float64), np.asarray(base["evals"], np.float64)], axis=-1)
    curves = np.concatenate([smoothed(run["losses"]), smoothed(base["losses"])], axis=-1)  # [S, 2T]
    held_out = comparison.get("velodrome_on") == "validation"
    curves[np.isnan(curves)] = np.inf  # the first w - 1 steps: never reached either way, and a fast `_median`

    def ratio(x):
        m = _median(x)
        return loss_ratio(m[:, 0], m[:, 1])

    def finals(x):  # x [B, S, 2 + 2T]: the final losses, then both smoothed curves
        return _median(x[..., :2])

    def curve(x, side):  # the median over the drawn seeds of one side's smoothed curve (0: L, 1: B)
        return _median(x[..., 2 + side * t:2 + (side + 1) * t])

    def speedup(x):
        fin = finals(x)
        t_l = first_reach(curve(x, 0), fin[:, 1])                # L reaches f_B
        out = np.where(np.isfinite(t_l), t / t_l, 0.0)
        slow = ~np.isfinite(t_l)
        if slow.any():                                           # else: the step at which B reaches f_L, over T
            t_b = first_reach(curve(x[slow], 1), fin[slow, 0])
            out[slow] = np.where(np.isfinite(t_b), t_b, t) / t
        return out

    def velodrome(x):
        return first_reach(curve(x, 1), finals(x)[:, 0]) / t   # B reaches f_L

    both = np.concatenate([f, curves], axis=-1)
    out = {"ratio_train": (f, ratio), "ratio_eval": (e, ratio), "speedup": (both, speedup),
           "velodrome_ratio": (both, velodrome)}
    if held_out:  # B's validation curve reaches L's final validation loss (scores' module docstring)
        steps = np.append(np.asarray(base["valid_steps"], np.float64), np.inf)
        v = np.concatenate([np.asarray(run["valids"], np.float64)[:, None],
                            np.asarray(base["valid_curve"], np.float64)], axis=-1)       # [S, 1 + K]

        def held_out_velodrome(x):
            k = first_reach(_median(x[..., 1:]), _median(x[..., :1])[:, 0])           # 1-based, inf: never
            return steps[np.where(np.isfinite(k), k - 1, len(steps) - 1).astype(int)] / t

        out["velodrome_ratio"] = (v, held_out_velodrome)
    return out


def summarize(comparisons: dict, runs: Optional[dict] = None, *, confidence_level: float = CONFIDENCE,
              n_resamples: int = N_RESAMPLES, seed: int = 0) -> dict:
    """Aggregates `compare_runs` results over the tasks of a suite.

    Args:
      comparisons: `{task name: compare_runs(...)}` for one optimizer against one baseline.
      runs: `{task name: (the optimizer's run, the baseline's best run)}`, for the intervals (None: none).
      confidence_level: the intervals' coverage.
      n_resamples: bootstrap resamples per interval.
      seed: the resampling's seed.

    Returns:
      `{"num_tasks", "wins_train", "wins_eval", "wins_speed", "iqm_ratio_train", "iqm_ratio_eval",
      "iqm_speedup", "iqm_velodrome", "intervals": {metric: {"iqm", "ci_low", "ci_high"}} for each of
      `METRICS` (absent without `runs`), "diverged", "not_below_initial", "collapsed", "eval_exploded",
      "velodrome_beyond_budget" (task names)}`.
    """
    c = list(comparisons.values())
    out = {"num_tasks": len(c),
           "wins_train": sum(x["win_train"] for x in c), "wins_eval": sum(x["win_eval"] for x in c),
           "wins_speed": sum(x["win_speed"] for x in c),
           "iqm_ratio_train": iqm([x["ratio_train"] for x in c]), "iqm_ratio_eval": iqm([x["ratio_eval"] for x in c]),
           "iqm_speedup": iqm([x["speedup"] for x in c]), "iqm_velodrome": iqm([x["velodrome_ratio"] for x in c]),
           "diverged": [t for t, x in comparisons.items() if x["diverged"]],
           "not_below_initial": [t for t, x in comparisons.items() if not x["below_initial"]],
           "collapsed": [t for t, x in comparisons.items() if x["collapsed"]],
           "eval_exploded": [t for t, x in comparisons.items() if x.get("eval_exploded")],
           "velodrome_beyond_budget": [t for t, x in comparisons.items() if x["velodrome_ratio"] == math.inf]}
    if runs is not None:
        strata = {t: pair_strata(*runs[t], comparisons[t]) for t in comparisons}
        out["intervals"] = {m: iqm_interval([strata[t][m] for t in comparisons], confidence_level=confidence_level,
                                            n_resamples=n_resamples, seed=seed) for m in METRICS}
    return out


def performance_profile(results: dict, by: str = "test") -> dict:
    """Every optimizer's test-loss (or final-train-loss) ratio to the best optimizer on each task (module docstring).

    Args:
      results: `{task name: its run dicts}`; each optimizer is taken at its best setting (`best_runs`).
      by: "test" (the loss on the eval split after training, "evals") or "train" (`final_loss`).

    Returns:
      `{"tasks": [names], "ratios": {optimizer: [r per task]} (inf: diverged), "taus": [the distinct
      finite ratios, ascending], "fractions": {optimizer: [rho(tau) for each tau]}}`.
    """
    if by not in ("test", "train"):
        raise ValueError(f"performance_profile: by must be 'test' or 'train', got {by!r}")
    tasks, losses = list(results), {}
    for i, runs in enumerate(results.values()):
        for name, r in best_runs(runs).items():
            finals = np.asarray(r["evals"], np.float64) if by == "test" else final_loss(r["losses"])
            bad = r.get("diverged") or diverged(r)
            losses.setdefault(name, [math.inf] * len(tasks))[i] = math.inf if bad else float(np.median(finals))
    table = np.array(list(losses.values()), np.float64).reshape(len(losses), len(tasks))  # [optimizers, tasks]
    best = np.min(table, axis=0) if len(losses) else np.zeros(len(tasks))
    ratios = np.where(np.isfinite(table), loss_ratio(table, np.broadcast_to(best, table.shape)), np.inf)
    taus = sorted(set(float(x) for x in ratios[np.isfinite(ratios)].ravel()))
    return {"tasks": tasks, "ratios": {name: ratios[i].tolist() for i, name in enumerate(losses)}, "taus": taus,
            "fractions": {name: [float(np.mean(ratios[i] <= tau)) for tau in taus] for i, name in enumerate(losses)}}

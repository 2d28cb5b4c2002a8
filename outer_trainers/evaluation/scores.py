"""How an optimizer's runs are scored against a tuned baseline's, per task and across tasks.

Scores of an optimizer L against a tuned baseline B (its rate chosen on validation loss,
`tuning.best_runs`) on one task of T steps (`compare_runs`), every statistic a median over seeds.
The headline is the test loss at the end of training; the train loss is secondary::

    test loss          e = mean loss over batches of the task's eval split ("test") after training
    validation loss    v = the same on the validation split ("inner_valid"), measured in the same
                       program (`task_trainer`); tuning reads it, scoring reports it
    test accuracy      a = fraction of the eval split's batches classified right (image classifiers)
    final train loss   f = mean train loss over the last w = max(1, T // 10) steps (`final_loss`)
    ratios             e_L / e_B (the headline), v_L / v_B and f_L / f_B    (< 1: L is better)
    smoothed curve     c(t) = mean of the train losses of steps t-w+1 .. t, for t >= w (1-based)
    time to reach      t_L = the first step t with median_seeds c_L(t) <= f_B  (the baseline's final train loss)
    speedup            T / t_L  when L reaches f_B within T steps;  otherwise t_B / T, where t_B is the
                       first step at which the baseline's curve reaches f_L (so speedup < 1 means L is slower)
    VeLOdrome          on held-out loss: v_B(t_k) the baseline's validation curve, measured after the
                       steps t_1 < ... < t_K = T of its run's "valid_steps" (`task_trainer.valid_schedule`,
                       20 evenly spaced points); steps = the first t_k with median_seeds v_B(t_k) <= v_L
                       (the optimizer's final validation loss): the steps the tuned baseline needs to
                       match L's held-out loss (None: not within T), and steps / T (inf when not within
                       T, "> budget"; > 1 can only be that). Against tuned Adam it is VeLO's VeLOdrome
                       metric (Metz et al. 2022) measured on held-out rather than train loss; the higher,
                       the better for L. Runs without validation curves fall back to the smoothed train
                       curves and f (`compare_runs`' "velodrome_on" says which)
    collapsed          f_L >= (1 - margin) * the task's trivial loss (`collapsed`)
    held-out exploded  on some seed, e_L > 10 * that seed's first train loss (`held_out_exploded`)

**Time to target, in wall-clock** (`wall_clock`): the seconds each optimizer needs to reach tuned
AdamW's final validation loss, its own optimizer step included::

    target   = median_seeds v_AdamW(T)                     (AdamW at its validation-selected rate)
    k*       = the first t_k with median_seeds v_L(t_k) <= target      (the sparse validation curve)
    seconds  = k* x s_L,   s_L = the measured wall time of one training step of L on the task

s_L is measured apart from the evaluation's batched runs (`wall_clock.step_seconds`): one run of the
task (its first seed's draw) trains a few steps in a jitted scan, compiled and run once to warm up,
then timed a few times; the fastest repeat over its steps is s_L. It holds the gradient, the
optimizer's update and the parameter update of one unbatched run on the evaluating machine, and not
the validation measurements. The step is resolved to the curve's spacing (T / 20): a reached
target is an upper bound by at most T / 20 steps, the same for every optimizer.

The curve is the same trailing mean that defines the final loss, so c_B(T) = f_B and a single lucky
minibatch cannot "reach" a target. A run with a non-finite train or held-out loss on any seed is
diverged (`diverged`): a diverged L scores ratio inf, speedup 0 and VeLOdrome 0 (and is reported as
diverged, not as a number); a baseline whose every rate diverged scores ratio 0, speedup inf and
VeLOdrome inf for L.

**Collapse.** A run can stay finite and end below its first loss yet learn nothing: a regression or
autoencoder that settles on predicting the mean output. A task may say what such a run scores: an
optional `trivial_loss` of the Task, a number or a method returning one, called with split="train"
when it takes a `split` (the train loss of the best input-independent predictor: the variance of the
targets for a squared-error regression or autoencoder, the entropy of the label marginal for a
classifier; `trivial_loss_of` reads it). A run whose final train loss is >= (1 - margin) *
trivial_loss (margin 0.05: it does not explain 5% of what the trivial predictor leaves) is
collapsed. Without a trivial loss the reference is the run's own initial loss with no margin
(`stability`: the mean of the first 1% of steps; `compare_runs`: the first step's, as its
`below_initial`): collapsed then means not below where it started, the rule `stability` always had.

**Held-out explosion.** A run can also end with a fine train loss while its weights have grown so
large that inputs it was not trained on give losses of 1e9: the held-out loss is finite, so the run
is not diverged, and the ratio alone reads like heavy over-fitting. A seed whose held-out loss is
more than `EXPLODE_FACTOR` (10) times its first train loss, the loss of the untrained model, is
flagged (`held_out_exploded`; `compare_runs`' "eval_exploded", the reports' "held-out exploded on").
The flag does not change the wins or ratios.

`stability` is the pass/fail check of one long run (finite, below where it started, not
collapsed). Across tasks: `aggregate` (IQMs, their bootstrap intervals, performance profiles).

Every function takes run dicts (`task_trainer`'s module docstring) and returns plain numbers.
"""
from __future__ import annotations

import inspect
import math
from typing import Any, Optional

import numpy as np

COLLAPSE_MARGIN = 0.05
EXPLODE_FACTOR = 10.0


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


def loss_ratio(a, b) -> Any:
    """a / b for losses (>= 0), with 0 / 0 = 1 and a / 0 = inf for a > 0 (a loss of exactly 0 happens:
    a saturated cross-entropy); elementwise for arrays.

    Args:
      a: the optimizer's loss(es).
      b: the reference loss(es).

    Returns:
      a float for scalars, else a float array.
    """
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(b == 0, np.where(a == 0, 1.0, np.inf * np.sign(a)), a / np.where(b == 0, 1.0, b))
    return float(out) if out.ndim == 0 else out


def first_reach(curves, targets) -> np.ndarray:
    """The first step (1-based) at which each curve is at or below its target, for many curves at once.

    Args:
      curves: [..., T] (NaN entries never count as reached, e.g. `smoothed`'s first w - 1 steps).
      targets: [...] the loss each curve must reach.

    Returns:
      float array [...]: the step, inf where the curve never reaches its target within T steps.
    """
    curves = np.asarray(curves, np.float64)
    hit = np.isfinite(curves) & (curves <= np.asarray(targets, np.float64)[..., None])
    return np.where(hit.any(axis=-1), hit.argmax(axis=-1) + 1.0, np.inf)


def steps_to_reach(losses, target: float) -> Optional[int]:
    """The first step (1-based) at which the median over seeds of the smoothed curve is <= `target`.

    t = min { t : median_seeds c(t) <= target }, c the `smoothed` curve (`first_reach` of the median curve).

    Args:
      losses: train losses [S, T].
      target: the loss to reach.

    Returns:
      the step, or None when it is never reached within T steps.
    """
    step = float(first_reach(np.median(smoothed(losses), axis=0), target))
    return int(step) if math.isfinite(step) else None


def diverged(run: dict) -> bool:
    """Whether any seed of a run has a non-finite train, test or validation loss.

    Args:
      run: a run dict ("losses" [S, T], "evals" [S], optionally "valids" [S]).

    Returns:
      True when the run diverged.
    """
    held_out = [run["evals"]] + ([run["valids"]] if "valids" in run else [])
    return bool(not np.all(np.isfinite(run["losses"])) or not all(np.all(np.isfinite(h)) for h in held_out))


def valid_steps_to_reach(run: dict, target: float) -> Optional[int]:
    """The first step of a run's validation curve at which its median over seeds is <= `target`.

    t = min { t_k : median_seeds v(t_k) <= target } over the run's "valid_steps" t_1 < ... < t_K.

    Args:
      run: a run dict with "valid_curve" [S, K] and "valid_steps" [K].
      target: the validation loss to reach.

    Returns:
      the step t_k, or None when no point of the curve reaches it.
    """
    k = float(first_reach(np.median(np.asarray(run["valid_curve"], np.float64), axis=0), target))
    return int(np.asarray(run["valid_steps"])[int(k) - 1]) if math.isfinite(k) else None


def _median_or_none(run: dict, key: str) -> Optional[float]:
    """The median over seeds of `run[key]`, or None when the run has no such entry."""
    return float(np.median(np.asarray(run[key], np.float64))) if key in run else None


def held_out_exploded(run: dict, factor: float = EXPLODE_FACTOR) -> np.ndarray:
    """Per seed, whether the held-out loss after training exploded (module docstring)::

        exploded = e > factor * l_1      (e finite, l_1 > 0 the seed's first train loss)

    Args:
      run: a run dict ("losses" [S, T], "evals" [S]).
      factor: how many times the untrained model's loss a held-out loss may be.

    Returns:
      bool array [S]; False for a non-finite held-out loss (that run diverged: `diverged`).
    """
    evals = np.asarray(run["evals"], np.float64)
    first = np.asarray(run["losses"], np.float64)[:, 0]
    with np.errstate(invalid="ignore"):
        return np.isfinite(evals) & np.isfinite(first) & (first > 0) & (evals > factor * first)


def trivial_loss_of(task: Any) -> Optional[float]:
    """A task's trivial loss (module docstring), or None when it declares none.

    Args:
      task: a Task; its optional `trivial_loss` is a number or a method returning one, called without
        arguments, or with split="train" when it takes a `split` (as `tasks.AutoencoderTask` and
        `tasks.LinearRegressionTask` do: the split the input-independent prediction is scored on;
        the protocol compares it with final train losses).

    Returns:
      the loss as a float, or None when the task has no `trivial_loss`, it is None, or it is not a
      finite number > 0 (then the initial loss is the reference).
    """
    value = getattr(task, "trivial_loss", None)
    if callable(value):
        try:
            takes_split = "split" in inspect.signature(value).parameters
        except (TypeError, ValueError):  # a callable without a signature
            takes_split = False
        value = value(split="train") if takes_split else value()
    if value is None:
        return None
    value = float(np.asarray(value))
    return value if math.isfinite(value) and value > 0 else None


def collapsed(final, initial, trivial_loss=None, margin: float = COLLAPSE_MARGIN) -> np.ndarray:
    """Whether runs ended no better than a trivial predictor (module docstring).

    ::

        collapsed = final >= (1 - margin) * trivial_loss   when the trivial loss is known,
                    final >= initial                        otherwise;

    never for a non-finite final loss (that run diverged: `diverged`).

    Args:
      final: final train losses [...] (`final_loss`).
      initial: the same runs' initial train losses [...].
      trivial_loss: None, or the trivial loss (a number, or [...] per run; None or NaN entries: unknown).
      margin: the fraction of the trivial loss a run must get below.

    Returns:
      bool array [...].
    """
    final, initial = np.asarray(final, np.float64), np.asarray(initial, np.float64)
    trivial = np.full(final.shape, np.nan) if trivial_loss is None else np.broadcast_to(
        np.asarray(trivial_loss, np.float64), final.shape)
    known = np.isfinite(trivial)
    with np.errstate(invalid="ignore"):
        out = np.where(known, final >= (1.0 - margin) * np.where(known, trivial, 0.0), final >= initial)
    return out & np.isfinite(final)


def stability(run: dict, trivial_loss=None, margin: float = COLLAPSE_MARGIN) -> dict:
    """Whether each seed of a (long) run stayed finite, ended below where it started and did not collapse.

    A seed passes when every train loss and its held-out loss are finite, its final train loss
    (mean of the last 10% of steps, `final_loss`) is below its initial one (mean of the first 1%,
    at least one step), and it is not `collapsed` against the task's trivial loss: the "never
    diverges, still learns" check of a learned optimizer run past its meta-training horizon.

    Args:
      run: a run dict ("losses" [S, T], "evals" [S]).
      trivial_loss: None, a number, or [S] (None entries: unknown), e.g. `trivial_loss_of` each seed's task.
      margin: `collapsed`'s margin.

    Returns:
      `{"initial", "final", "max", "eval": [S] float lists (possibly non-finite; "max" skips NaN steps),
      "trivial_loss": [S] (None: unknown), "collapsed": [S] bools, "ok": [S] bools, "all_ok": bool}`.
    """
    losses = np.asarray(run["losses"], np.float64)
    evals = np.asarray(run["evals"], np.float64)
    head = max(1, losses.shape[-1] // 100)
    initial = losses[:, :head].mean(axis=-1)
    final = final_loss(losses)
    trivial = _per_seed(trivial_loss, losses.shape[0])
    flat = collapsed(final, initial, trivial, margin)
    finite = np.all(np.isfinite(losses), axis=-1) & np.isfinite(evals)
    ok = finite & (final < initial) & ~flat
    peak = [float(row[~np.isnan(row)].max()) if not np.isnan(row).all() else float("nan") for row in losses]
    return {"initial": initial.tolist(), "final": final.tolist(), "max": peak, "eval": evals.tolist(),
            "trivial_loss": [None if np.isnan(t) else float(t) for t in trivial], "collapsed": flat.tolist(),
            "ok": ok.tolist(), "all_ok": bool(ok.all())}


def _per_seed(trivial_loss, num_seeds: int) -> np.ndarray:
    """A trivial loss (None, a number or per-seed values with None entries) as [S] floats, NaN where unknown."""
    if trivial_loss is None:
        return np.full(num_seeds, np.nan)
    values = np.atleast_1d(np.asarray(trivial_loss, dtype=object))
    values = np.array([np.nan if v is None else float(v) for v in values], np.float64)
    return np.broadcast_to(values, (num_seeds,)).copy()


def compare_runs(run: dict, base: dict, trivial_loss=None, margin: float = COLLAPSE_MARGIN) -> dict:
    """Scores an optimizer's run against a tuned baseline's best run on one task (module docstring).

    Args:
      run: the optimizer's run: "losses" [S, T], "evals" [S] (test losses) and, as `task_trainer`
        measures them, "valids" [S], "valid_curve" [S, K], "valid_steps" [K], "accuracy" [S].
      base: the baseline's best run (`best_runs`; "diverged": True when every rate diverged), same seeds.
      trivial_loss: the task's trivial loss (None: unknown; a number or [S]), for "collapsed".
      margin: `collapsed`'s margin.

    Returns:
      `{"eval", "baseline_eval", "ratio_eval" (the test loss: the headline), "valid",
      "baseline_valid", "ratio_valid" (validation; None without "valids"), "accuracy",
      "baseline_accuracy" (test accuracy; None when not measured), "velodrome_on" ("validation",
      or "train" for runs without validation curves), "final_train", "baseline_final_train", "ratio_train",
      "initial_train", "below_initial", "steps_to_reach" (None: never), "baseline_steps_to_reach"
      (of the optimizer's final loss; None unless needed), "speedup", "velodrome_steps" (None: not
      within the budget), "velodrome_ratio" (inf: not within the budget), "trivial_loss" (None:
      unknown), "collapsed", "eval_exploded" (`held_out_exploded` on some seed), "diverged",
      "baseline_diverged", "win_train", "win_eval", "win_speed"}`: medians over seeds, floats.
    """
    t = run["losses"].shape[-1]
    f_l, e_l = float(np.median(final_loss(run["losses"]))), float(np.median(run["evals"]))
    f_b, e_b = float(np.median(final_loss(base["losses"]))), float(np.median(base["evals"]))
    initial = float(np.median(run["losses"][:, 0]))
    trivial = _per_seed(trivial_loss, run["losses"].shape[0])
    trivial = float(np.median(trivial)) if np.all(np.isfinite(trivial)) else None
    held_out = all(k in r for r in (run, base) for k in ("valids", "valid_curve", "valid_steps"))
    v_l, v_b = _median_or_none(run, "valids"), _median_or_none(base, "valids")
    out = {"final_train": f_l, "baseline_final_train": f_b, "eval": e_l, "baseline_eval": e_b,
           "valid": v_l, "baseline_valid": v_b, "ratio_valid": None,
           "accuracy": _median_or_none(run, "accuracy"), "baseline_accuracy": _median_or_none(base, "accuracy"),
           "velodrome_on": "validation" if held_out else "train",
           "initial_train": initial, "below_initial": bool(np.isfinite(f_l) and f_l < initial),
           "steps_to_reach": None, "baseline_steps_to_reach": None, "velodrome_steps": None,
           "trivial_loss": trivial, "collapsed": bool(collapsed(f_l, initial, trivial, margin)),
           "eval_exploded": bool(np.any(held_out_exploded(run))),
           "diverged": diverged(run), "baseline_diverged": bool(base.get("diverged", False) or diverged(base))}
    if out["diverged"]:
        out.update(ratio_train=math.inf, ratio_eval=math.inf, speedup=0.0, velodrome_ratio=0.0)
        out["ratio_valid"] = None if v_l is None else math.inf
    elif out["baseline_diverged"]:
        out.update(ratio_train=0.0, ratio_eval=0.0, speedup=math.inf, velodrome_ratio=math.inf)
        out["ratio_valid"] = None if v_l is None else 0.0
    else:
        out.update(ratio_train=loss_ratio(f_l, f_b), ratio_eval=loss_ratio(e_l, e_b))
        if v_l is not None and v_b is not None:
            out["ratio_valid"] = loss_ratio(v_l, v_b)
        out["velodrome_steps"] = valid_steps_to_reach(base, v_l) if held_out else steps_to_reach(base["losses"], f_l)
        out["velodrome_ratio"] = out["velodrome_steps"] / t if out["velodrome_steps"] is not None else math.inf
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

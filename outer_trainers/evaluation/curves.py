"""The plots of an evaluation: the training curves (curves.png, curves.npz) and the performance profile.

    plot_curves("curves.png", results)   # per task, each optimizer and tuned baseline at its best rate
    save_curves("curves.npz", results)   # every run's [seeds, steps] train losses and validation curve
    plot_performance_profile("performance_profile.png", aggregate.performance_profile(results))

`results` is `{task name: its run dicts}` (`suite_runs.run_task`). matplotlib is imported only
when a plot is drawn (the Agg backend: no display needed).
"""
from __future__ import annotations

import numpy as np

from outer_trainers.evaluation.report import DIVERGED
from outer_trainers.evaluation.tuning import best_runs


def plot_curves(path: str, results: dict) -> None:
    """Plots, per task, the train-loss curves of every optimizer and baseline at its best rate.

    Each curve is the median over seeds with a min–max band; the y axis is clipped at 10× the
    largest median starting loss (so diverging curves do not squash the others) and is
    logarithmic when every finite run's losses are >= 0 (a loss of exactly 0, a saturated
    cross-entropy, is clipped to the bottom). Up to 4 tasks per row.

    Args:
      path: the PNG file to write.
      results: `{task name: run_task's runs}`.
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    n = len(results)
    cols = min(n, 4)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 4 * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    for ax, (task, runs) in zip(axes.flat, results.items()):
        for name, r in best_runs(runs).items():
            losses = r["losses"]
            steps = np.arange(1, losses.shape[1] + 1)
            label = name if np.isnan(r["learning_rate"]) else f"{name} (lr={r['learning_rate']:.2g})"
            label += DIVERGED if r.get("diverged") else ""
            ax.plot(steps, np.median(losses, 0), label=label)
            ax.fill_between(steps, np.min(losses, 0), np.max(losses, 0), alpha=0.2)
        if all(np.all(np.asarray(r["losses"]) >= 0) for r in runs if np.all(np.isfinite(r["losses"]))):
            ax.set_yscale("log", nonpositive="clip")  # before the limit below, which a linear axis would set below 0
        starts = [np.median(r["losses"][:, 0]) for r in runs if np.all(np.isfinite(r["losses"][:, 0]))]
        if starts and np.isfinite(max(starts)):  # keep diverging curves from squashing the others
            ax.set_ylim(top=max(10 * max(starts), 1e-12) if max(starts) > 0 else None)
        ax.set_title(task)
        ax.set_xlabel("step")
        ax.set_ylabel("train loss")
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def plot_performance_profile(path: str, profile: dict) -> None:
    """Plots each optimizer's performance profile: the fraction of tasks rho(tau) on which its test
    loss is within a factor tau of the best optimizer's (`aggregate.performance_profile`).

    A step curve per optimizer over tau from 1 to past the largest finite ratio (log axis); a
    diverged task never counts, so a curve may stay below 1.

    Args:
      path: the PNG file to write.
      profile: `aggregate.performance_profile(results)`.
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    top = max([1.0] + profile["taus"]) * 1.5
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, ratios in profile["ratios"].items():
        r = np.sort(np.asarray(ratios, np.float64))
        taus = np.concatenate([[1.0], r[np.isfinite(r)], [top]])
        ax.step(taus, [np.mean(r <= tau) for tau in taus], where="post", label=name)
    ax.set_xscale("log")
    ax.set_xlim(1.0, top)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("tau: test loss / the best optimizer's on the task")
    ax.set_ylabel(f"fraction of the {len(profile['tasks'])} tasks with ratio <= tau")
    ax.set_title("performance profile")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def save_curves(path: str, results: dict) -> None:
    """Saves every run's train losses and validation curve to an .npz file.

    Args:
      path: the .npz file to write.
      results: `{task name: run_task's runs}`; each run is stored under
        "TASK/OPTIMIZER/LEARNING_RATE" (the rate formatted with 6 significant digits, "nan" for a
        learned optimizer; "/wdDECAY/SCHEDULE" appended for a baseline tuned by `grid_search`) as its [seeds, steps] losses, and, when measured, under
        "valid/TASK/OPTIMIZER/LEARNING_RATE" its [seeds, K] validation curve and
        "valid_steps/TASK/OPTIMIZER/LEARNING_RATE" the K steps it was measured after.
    """
    arrays = {}
    for t, runs in results.items():
        for r in runs:
            name = f"{t}/{r['optimizer']}/{r['learning_rate']:.6g}"
            if "schedule" in r:  # a grid_search run: its decay and schedule too, so no two points share a name
                name += f"/wd{r['weight_decay']:.6g}/{r['schedule']}"
            arrays[name] = r["losses"]
            if "valid_curve" in r:
                arrays[f"valid/{name}"], arrays[f"valid_steps/{name}"] = r["valid_curve"], r["valid_steps"]
    np.savez(path, **arrays)

"""Tuning a baseline over rate x weight decay x schedule, in two stages, on validation loss.

    make_tx = scheduled_baseline("adamw", num_steps)        # baselines.schedules
    runs = tune_baseline(family, "adamw:tuned", make_tx, num_steps, cfgs, keys, lrs=default_lrs("adamw"),
                         weight_decays=default_weight_decays("adamw"), schedules=("constant", "cosine"))
    best = best_runs(runs)["adamw:tuned"]    # its "learning_rate", "weight_decay", "schedule"

A grid point is p = (lr, wd, schedule). The score of p over a set of seeds is `tuning.best_runs`'
rule: the median over those seeds of the final validation loss, infinite when any seed diverged.
The rule, the same for every baseline (`TWO_STAGE`):

1. Stage 1: the first `stage1_seeds` seeds (default 2) train at every point of the product grid
   lrs x weight_decays x schedules, in one vmapped (or, for convnets, sequential) jitted program.
   While the best point p* lies on an edge of the rate or the decay axis (its value the axis's
   largest or smallest), `extend_by` more values are added past that edge at the axis's spacing
   (the rates' geometric step; the positive decays' step, 10 with fewer than two), each with every
   value of the other axes, so the grid stays a product; at most `max_extensions` rounds. A decay
   axis holding 0 has no low edge (0 is no decay); every point diverged counts as p* on the low
   rate edge.
2. Stage 2: every seed trains at the `top_k` best points of stage 1 (default 3; finite scores
   first, ties to the earlier point), and the best of them on all seeds is the baseline's setting.

`top_k=None` is the full grid instead: every seed at every point (and every extension), as
`tuning.tune_learning_rate` runs a rate grid. The runs returned are the last stage's, one run dict per
point, each with "learning_rate", "weight_decay", "schedule" and "grid_edge" (the edges of stage 1's
grid on which that point lies, e.g. "high" for the largest rate tried, "decay high"; None inside),
so that `best_runs` picks the setting and `grid_edge` reports its edge. Test data never enters: the
rule reads validation losses only (or train losses, `select_by="train"`). The extension rounds pad
their points to a power of two, so that few shapes compile.
"""
from __future__ import annotations

import itertools
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from outer_trainers.evaluation.baselines.schedules import SCHEDULES, check_schedule, schedule_index
from outer_trainers.evaluation.task_trainer import VALID_SPLIT, MakeTx, make_task_trainer, run_dict
from outer_trainers.evaluation.tuning import _tuning_score, check_learning_rates
from tasks.base import TaskFamily

TOP_K = 3
# Two seeds in stage 1: on validation-cpu one seed chose the full grid's setting on 4 of 6 tasks, two on 5 of 6
# at 78% of the full grid's CPU time (docs/evaluation.md, "the two-stage rule against the full grid").
STAGE1_SEEDS = 2
TWO_STAGE = (f"stage 1: the first {STAGE1_SEEDS} seeds over the whole grid (rate x weight decay x schedule, "
             f"extended at its edges); stage 2: every seed at the {TOP_K} best points of stage 1, the best "
             f"median final validation loss over seeds chosen")


def _spacing(values: Sequence[float], default: float = 10.0) -> float:
    """The geometric step of a grid's positive values (their range over their count - 1), else `default`."""
    pos = sorted(v for v in values if v > 0)
    return (pos[-1] / pos[0]) ** (1.0 / (len(pos) - 1)) if len(pos) > 1 and pos[-1] > pos[0] else default


def _edges(point: tuple, axes: Sequence[Sequence[float]]) -> list[tuple[int, str]]:
    """The (axis, "low" | "high") edges of the product grid `axes` (rates, decays) on which `point` lies;
    an axis of one value has none, and a decay axis holding 0 no low edge (0 is no decay)."""
    edges = []
    for axis, values in enumerate(axes):
        if len(values) < 2:
            continue  # a single value (Adam's and SGD's decay 0) is not a grid to extend
        if point[axis] == max(values):
            edges.append((axis, "high"))
        if point[axis] == min(values) and not (axis == 1 and point[axis] == 0.0):
            edges.append((axis, "low"))
    return edges


def _edge_label(edges: list[tuple[int, str]]) -> Optional[str]:
    """"low"/"high" for the rate axis, "decay low"/"decay high" for the decay axis, joined; None without edges."""
    return ", ".join(side if axis == 0 else f"decay {side}" for axis, side in edges) or None


def check_grid(lrs: Sequence[float], weight_decays: Sequence[float], schedules: Sequence[str],
               what: str) -> tuple[list[float], list[float], list[str]]:
    """The three axes of a grid checked and sorted, or ValueError naming `what`.

    Args:
      lrs: the rates (finite, > 0).
      weight_decays: the decays (finite, >= 0, at least one).
      schedules: schedule names of `schedules.SCHEDULES`, at least one.
      what: the caller, for the messages.

    Returns:
      (rates ascending, decays ascending, schedules deduplicated in order).
    """
    rates = sorted(check_learning_rates(lrs, f"{what}: lrs"))
    try:
        decays = sorted(float(w) for w in weight_decays)
    except (TypeError, ValueError):
        raise ValueError(f"{what}: weight_decays must be a sequence of numbers, got {weight_decays!r}") from None
    if not decays or not all(np.isfinite(w) and w >= 0 for w in decays):
        raise ValueError(f"{what}: weight_decays must hold at least one decay, each finite and >= 0, got "
                         f"{weight_decays!r}")
    scheds = list(dict.fromkeys(check_schedule(s, f"{what}: schedules") for s in schedules))
    if not scheds:
        raise ValueError(f"{what}: no schedule; give at least one of {list(SCHEDULES)}")
    return rates, decays, scheds


def tune_baseline(family: TaskFamily, name: str, make_tx: MakeTx, num_steps: int, cfgs: Any, keys: jax.Array, *,
                  lrs: Sequence[float], weight_decays: Sequence[float] = (0.0,),
                  schedules: Sequence[str] = ("constant",), top_k: Optional[int] = TOP_K,
                  stage1_seeds: int = STAGE1_SEEDS, extend_by: int = 2, max_extensions: int = 4,
                  eval_split: str = "test", eval_batches: int = 8, sequential: bool = False,
                  valid_split: str = VALID_SPLIT, valid_points: int = 1, select_by: str = "valid") -> list[dict]:
    """Tunes a baseline's rate, weight decay and schedule by the two-stage rule of the module docstring.

    Args:
      family: the task family `cfgs` were drawn from.
      name: the baseline's name in the runs (e.g. "adamw:tuned").
      make_tx: `{"learning_rate", "weight_decay", "schedule"} -> optax transform`, every entry traced
        (`schedules.scheduled_baseline`).
      num_steps: training steps per run (the schedules' budget).
      cfgs: S task cfgs (one per seed).
      keys: S run keys.
      lrs: the starting rates (>= 2 to be extendable).
      weight_decays: the starting decays (0 allowed).
      schedules: the schedules tried (`schedules.SCHEDULES` names).
      top_k: the stage-1 points every seed trains at in stage 2; None: the full grid on every seed.
      stage1_seeds: the seeds (the first ones) of stage 1.
      extend_by: values added past an edge per extension.
      max_extensions: the most extension rounds (0: the grid as given).
      eval_split: the data split of the test loss after training.
      eval_batches: batches averaged for each held-out loss.
      sequential: run the points and seeds one after another in the program (`make_task_trainer`).
      valid_split: the validation split.
      valid_points: validation measurements per run.
      select_by: "valid" (the protocol's) or "train" (`tuning.best_runs`).

    Returns:
      the last stage's run dicts (`task_trainer`'s module docstring, float64, [S] seeds each), one per
      point, ascending in (rate, decay, schedule), with "weight_decay", "schedule" and "grid_edge" added
      (and "stage1_score", the point's stage-1 score, after two stages).
    """
    rates, decays, scheds = check_grid(lrs, weight_decays, schedules, f"tune_baseline({name})")
    num_seeds = int(keys.shape[0])
    if top_k is not None and (isinstance(top_k, bool) or int(top_k) < 1):
        raise ValueError(f"tune_baseline({name}): top_k must be >= 1 or None, got {top_k!r}")
    if not 1 <= int(stage1_seeds):
        raise ValueError(f"tune_baseline({name}): stage1_seeds must be >= 1, got {stage1_seeds!r}")
    two_stage = top_k is not None and int(stage1_seeds) < num_seeds
    trainer = make_task_trainer(family, make_tx, num_steps, eval_split=eval_split, eval_batches=eval_batches,
                                batched_args=True, sequential=sequential, valid_split=valid_split,
                                valid_points=valid_points)

    def run(points, n, size=0):
        padded = list(points) + [points[-1]] * (size - len(points))  # one shape, one compile, for every extension
        args = {"learning_rate": jnp.asarray([p[0] for p in padded], jnp.float32),
                "weight_decay": jnp.asarray([p[1] for p in padded], jnp.float32),
                "schedule": jnp.asarray([schedule_index(p[2]) for p in padded], jnp.int32)}
        first = lambda x: x[:n]
        out = jax.device_get(trainer(args, jax.tree_util.tree_map(first, cfgs), keys[:n], family.data))
        runs = []
        for i, p in enumerate(points):
            r = run_dict(name, p[0], {k: v[i] for k, v in out.items()}, num_steps, valid_points)
            runs.append({**r, "weight_decay": float(p[1]), "schedule": p[2]})
        return runs

    stage1_n = int(stage1_seeds) if two_stage else num_seeds
    axes = [list(rates), list(decays)]
    points = list(itertools.product(rates, decays, scheds))
    runs = run(points, stage1_n)
    steps = (_spacing(rates), _spacing(decays))
    for _ in range(max_extensions):
        scores = [_tuning_score(r, select_by) for r in runs]
        best = points[int(np.argmin(scores))]
        edges = [(0, "low")] if not np.isfinite(min(scores)) else _edges(best, axes)
        if not edges:
            break
        for axis, side in edges:  # the grid stays a product: new values x every value of the other axes
            start = min(axes[axis]) if side == "low" else max(axes[axis])
            factor = steps[axis] ** (-1 if side == "low" else 1)
            axes[axis] = sorted(axes[axis] + [start * factor ** k for k in range(1, extend_by + 1)])
        new = [p for p in itertools.product(axes[0], axes[1], scheds) if p not in points]
        size = 1 << (len(new) - 1).bit_length()  # padded to a power of two: few shapes, few compiles
        points += new
        runs += run(new, stage1_n, size)
    scores = [_tuning_score(r, select_by) for r in runs]
    for r, p in zip(runs, points):
        r["grid_edge"] = _edge_label(_edges(p, axes))
    ascending = lambda rs: sorted(rs, key=lambda r: (r["learning_rate"], r["weight_decay"],
                                                     SCHEDULES.index(r["schedule"])))
    if not two_stage:
        return ascending(runs)
    order = sorted(range(len(points)), key=lambda i: (scores[i], i))[:int(top_k)]
    final = run([points[i] for i in order], num_seeds)
    for r, i in zip(final, order):
        r["grid_edge"] = runs[i]["grid_edge"]
        r["stage1_score"] = scores[i]
    return ascending(final)

"""Learning-rate schedules of the baselines over a task's step budget, and the baselines on them.

    sched = lr_schedule("cosine", 1e-3, num_steps=1000)          # an optax schedule: count -> rate
    rate = scheduled_rate(schedule_index("cosine"), lr, 1000)    # the same, the schedule a traced index

A baseline trained for T steps (the budget a learned optimizer is told as its horizon) takes its
step at count t = 0 .. T - 1 from one of `SCHEDULES`, with peak rate lr and W = round(f T)
warm-up steps (f the warm-up fraction, `WARMUP_FRACTION` = 5% by default):

    constant  lr                                                           (optax.constant_schedule)
    cosine    lr t / W for t < W, then lr (1 + cos(pi (t - W) / (T - W))) / 2, reaching 0 at T
              (optax.warmup_cosine_decay_schedule(0, lr, W, T, end_value=0))
    linear    lr t / W for t < W, then lr (1 - (t - W) / (T - W)), reaching 0 at T
              (optax.join_schedules of two optax.linear_schedule, boundary W)

The warm-up starts at 0, as AlgoPerf's baselines and optax's schedules do, so a scheduled
baseline's first update is zero. Every schedule is optax's own: no hand-written rate arithmetic.
`scheduled_rate` evaluates all three and picks one by a (traced) index, so a grid over schedules
runs in one compiled program with the rates and weight decays: `scheduled_baseline(name, T)` is a
baseline of `tuning` (Adam, AdamW, Muon, SGD with momentum) whose rate, weight decay and schedule
are all arguments of one traced pytree.
"""
from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import optax
from optax import contrib as optax_contrib

from outer_trainers.evaluation.task_trainer import MakeTx
from outer_trainers.evaluation.tuning import baseline, baseline_names, muon_dimension_numbers
from tasks.base import check_count

SCHEDULES = ("constant", "cosine", "linear")
WARMUP_FRACTION = 0.05


def check_schedule(name: str, what: str = "schedule") -> str:
    """The schedule's name, or ValueError naming `what` and the valid schedules.

    Args:
      name: a schedule name.
      what: where it came from, for the message.

    Returns:
      `name`.
    """
    if name not in SCHEDULES:
        raise ValueError(f"{what}: unknown schedule {name!r}; the schedules are {list(SCHEDULES)}")
    return name


def warmup_steps(num_steps: int, warmup_fraction: float = WARMUP_FRACTION) -> int:
    """W = round(f T), the warm-up steps of a scheduled run of T steps (at most T - 1).

    Args:
      num_steps: T, the step budget (>= 1).
      warmup_fraction: f, in [0, 1).

    Returns:
      W.
    """
    t = check_count(num_steps, "warmup_steps: num_steps")
    if not 0.0 <= warmup_fraction < 1.0:
        raise ValueError(f"warmup_fraction must be in [0, 1), got {warmup_fraction!r}")
    return min(int(round(warmup_fraction * t)), t - 1)


def lr_schedule(name: str, learning_rate: Any, num_steps: int,
                warmup_fraction: float = WARMUP_FRACTION) -> optax.Schedule:
    """The optax schedule `name` (module docstring) with peak `learning_rate` over `num_steps`.

    Args:
      name: one of `SCHEDULES`.
      learning_rate: the peak rate lr (a float or a traced scalar).
      num_steps: T, the step budget.
      warmup_fraction: f: W = round(f T) linear warm-up steps from 0 ("cosine", "linear").

    Returns:
      count -> rate: lr times `unit_schedule(name, num_steps, warmup_fraction)`.
    """
    unit = unit_schedule(name, num_steps, warmup_fraction)
    return lambda count: learning_rate * unit(count)


def unit_schedule(name: str, num_steps: int, warmup_fraction: float = WARMUP_FRACTION) -> optax.Schedule:
    """The optax schedule `name` (module docstring) with peak 1 over `num_steps`: `lr_schedule` is lr times it.

    A traced peak rate multiplies it rather than entering optax (optax.warmup_cosine_decay_schedule
    branches on its peak value in Python).

    Args:
      name: one of `SCHEDULES`.
      num_steps: T, the step budget.
      warmup_fraction: f.

    Returns:
      count -> the schedule's factor in [0, 1].
    """
    check_schedule(name, "lr_schedule")
    w = warmup_steps(num_steps, warmup_fraction)
    if name == "constant":
        return optax.constant_schedule(1.0)
    if name == "cosine":
        return optax.warmup_cosine_decay_schedule(0.0, 1.0, w, num_steps, end_value=0.0)
    return optax.join_schedules([optax.linear_schedule(0.0, 1.0, w), optax.linear_schedule(1.0, 0.0, num_steps - w)],
                                [w])


def schedule_index(name: str) -> int:
    """The index of schedule `name` in `SCHEDULES`, as `scheduled_rate` takes it."""
    return SCHEDULES.index(check_schedule(name, "schedule_index"))


def scheduled_rate(index: Any, learning_rate: Any, num_steps: int,
                   warmup_fraction: float = WARMUP_FRACTION) -> optax.Schedule:
    """The schedule `SCHEDULES[index]` with a traced index: every schedule evaluated, one picked.

    Args:
      index: an int32 scalar (may be traced), `schedule_index`'s value.
      learning_rate: the peak rate (may be traced).
      num_steps: T.
      warmup_fraction: f.

    Returns:
      count -> `lr_schedule(SCHEDULES[index], learning_rate, num_steps, warmup_fraction)(count)`.
    """
    units = [unit_schedule(n, num_steps, warmup_fraction) for n in SCHEDULES]
    factors = lambda count: [jnp.broadcast_to(jnp.asarray(u(count), jnp.float32), jnp.shape(count)) for u in units]
    return lambda count: learning_rate * jnp.stack(factors(count))[index]


def scheduled_baseline(name: str, num_steps: int, *, momentum: float = 0.9,
                       warmup_fraction: float = WARMUP_FRACTION) -> MakeTx:
    """A baseline whose rate follows a schedule over `num_steps` and whose decay is an argument (module docstring).

    Args:
      name: a baseline name ("adam", "adamw", "muon", "sgdm").
      num_steps: T, the step budget the schedule spans.
      momentum: SGD's momentum.
      warmup_fraction: the warm-up fraction of the warm-up schedules (`warmup_steps`).

    Returns:
      `args -> optax transform`, where args is `{"learning_rate": peak rate, "weight_decay": wd (read by
      AdamW and Muon only), "schedule": int32 index into SCHEDULES}`, every entry may be traced.
    """
    if name not in baseline_names():
        raise ValueError(f"unknown baseline {name!r}; the baselines are {baseline_names()}")
    if name == "muon":
        baseline("muon")  # the optax version check

    def make_tx(args):
        rate = scheduled_rate(args["schedule"], args["learning_rate"], num_steps, warmup_fraction)
        return baseline_transform(name, rate, args["weight_decay"], momentum=momentum)
    return make_tx


def baseline_transform(name: str, learning_rate: Any, weight_decay: Any, *,
                       momentum: float = 0.9) -> optax.GradientTransformation:
    """A baseline's optax transform at a given rate (a float, traced scalar or optax schedule) and decay.

    Args:
      name: "adam" (optax.adam), "adamw" (optax.adamw), "muon" (optax.contrib.muon, routed by
        `tuning.muon_dimension_numbers`) or "sgdm" (optax.sgd with `momentum`).
      learning_rate: the rate or schedule.
      weight_decay: the decoupled decay (times the rate, as optax does) of AdamW and Muon; Adam and SGD
        ignore it.
      momentum: SGD's momentum.

    Returns:
      the optax transform.
    """
    if name == "adam":
        return optax.adam(learning_rate)
    if name == "adamw":
        return optax.adamw(learning_rate, weight_decay=weight_decay)
    if name == "muon":
        return optax_contrib.muon(learning_rate, weight_decay=weight_decay,
                                  muon_weight_dimension_numbers=muon_dimension_numbers)
    if name == "sgdm":
        return optax.sgd(learning_rate, momentum=momentum)
    raise ValueError(f"unknown baseline {name!r}; the baselines are {baseline_names()}")

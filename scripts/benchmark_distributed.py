#!/usr/bin/env python
"""Benchmark the distributed path: local outer steps vs 1 and 2 Ray workers, and its overhead.

On the problems of `benchmark_estimators.py` — (a) QuadraticFamily dim 10, (b) dim 1000, (c) an
MLP 64→32→10 on digits at batch 128 — with MLPLOpt and TruncatedPES (8 tasks, truncation 50: 800
inner steps per estimate), report per configuration, after `--warmup` steps (compilation):

  est/s        estimates applied per second (steady state, median over the timed steps)
  inner/s      inner steps per second (800 per estimate)
  worker ms    time inside one estimate call on a worker (or the local estimate)
  round ovh    per synchronous round: its wall time minus the slowest worker's estimate time
               (theta out, gradients back through the object store, scheduling)
  step ovh     per outer step: its wall time (callback to callback) minus the slowest worker's
               estimate time (the above plus the learner's update, logging and key splits)

Local: `outer_step` with one estimator in this process. Ray N: `ray_outer_train` in synchronous
mode with N estimators on N single-threaded workers (so each step yields N estimates). Also
measured: the learner's update time per estimate and an object-store round trip of theta for
MLPLOpt and AdafacMLPLOpt, the inputs of the scaling estimate in docs/benchmarks.md.

    python scripts/benchmark_distributed.py [--problems a,b,c] [--workers 1,2] [--steps 8]
"""
from __future__ import annotations

import argparse
import functools
import os
import platform
import statistics
import time

import jax
import numpy as np
import optax

import lopt
import outer_trainers as ot
from outer_trainers.distributed import RayWorkers
import tasks

NUM_TASKS, TRUNC = 8, 50


def problems() -> dict:
    """key -> (label, TaskFamily) of the benchmark problems."""
    return {
        "a": ("quadratic dim 10", lambda: tasks.QuadraticFamily(dim=10)),
        "b": ("quadratic dim 1000", lambda: tasks.QuadraticFamily(dim=1000)),
        "c": ("MLP 64-32-10, batch 128", lambda: tasks.single_task_family(
            tasks.ImageMLPTask("digits", hidden_sizes=(32,), batch_size=128))),
    }


def make_run(problem: str, num_estimators: int = 1):
    """(GradientLearner, [TruncatedPES] * num_estimators) of a benchmark problem (picklable via functools.partial)."""
    family = problems()[problem][1]()
    lo = lopt.MLPLOpt()
    step = ot.LOptTruncatedStep(family, lo, ot.LogUniformTruncationSchedule(100, 1000))
    ests = [ot.TruncatedPES(step, NUM_TASKS, TRUNC, std=0.01) for _ in range(num_estimators)]
    return ot.GradientLearner(lo, optax.adam(1e-4)), ests


def bench_local(problem: str, steps: int, warmup: int) -> dict:
    learner, ests = make_run(problem)
    state = ot.init_outer_state(learner, ests, jax.random.key(0))
    times, est_times = [], []
    for i in range(warmup + steps):
        t = time.perf_counter()
        key, k = jax.random.split(state.key)
        s, e = ests[0].estimate(state.theta, state.estimator_states[0], k, outer_state=i)
        jax.block_until_ready(e)
        t_est = time.perf_counter() - t
        ls, _ = learner.update(state.learner_state, [e])
        jax.block_until_ready(ls)
        state = ot.OuterTrainState(ls, (s,), key, state.iteration + 1)
        if i >= warmup:
            times.append(time.perf_counter() - t)
            est_times.append(t_est)
    step_s = statistics.median(times)
    return {"est_s": 1 / step_s, "worker_ms": 1e3 * statistics.median(est_times), "overhead_ms": 0.0,
            "step_overhead_ms": 1e3 * statistics.median(t - e for t, e in zip(times, est_times))}


def bench_ray(problem: str, workers: int, steps: int, warmup: int) -> dict:
    rows = []
    ot.ray_outer_train(functools.partial(make_run, problem, workers), warmup + steps, num_workers=workers,
                       progress=False, workers=RayWorkers(stall_timeout_s=1800),
                       callback=lambda step, st, m: rows.append((step, time.perf_counter(), m)))
    timed = [(t, m) for step, t, m in rows if step > warmup]
    pairs = list(zip(timed, timed[1:]))
    step_s = statistics.median(b[0] - a[0] for a, b in pairs)  # callback to callback: the learner's work included
    worker_s = statistics.median(m["timing/worker_s"] for _, m in timed)
    over = statistics.median(m["timing/round_s"] - m["timing/worker_s"] for _, m in timed)
    step_over = statistics.median(b[0] - a[0] - b[1]["timing/worker_s"] for a, b in pairs)
    return {"est_s": workers / step_s, "worker_ms": 1e3 * worker_s, "overhead_ms": 1e3 * over,
            "step_overhead_ms": 1e3 * step_over}


def learner_costs(repeats: int = 20) -> list[tuple]:
    """Per theta size: bytes, the learner's update time per estimate (8 estimates per update) and an
    object-store put + get round trip of theta (this machine: no network)."""
    import ray
    out = []
    for lo in (lopt.MLPLOpt(), lopt.AdafacMLPLOpt()):
        learner = ot.GradientLearner(lo, optax.adam(1e-4))
        state = learner.init(jax.random.key(0))
        n = sum(x.size for x in jax.tree_util.tree_leaves(state.theta))
        est = ot.Estimate(jax.tree_util.tree_map(lambda x: x * 0.01, state.theta), np.float32(1.0))
        jax.block_until_ready(learner.update(state, [est] * 8))
        t = time.perf_counter()
        for _ in range(repeats):
            jax.block_until_ready(learner.update(state, [est] * 8))
        update_ms = 1e3 * (time.perf_counter() - t) / repeats / 8
        theta_np = jax.tree_util.tree_map(np.asarray, state.theta)
        t = time.perf_counter()
        for _ in range(repeats):
            ray.get(ray.put(theta_np))
        put_ms = 1e3 * (time.perf_counter() - t) / repeats
        out.append((type(lo).__name__, n, 4 * n, update_ms, put_ms))
    return out


def main(argv=None) -> None:
    """Runs the benchmark and prints markdown tables (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--problems", default="a,b,c")
    p.add_argument("--workers", default="1,2")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    args = p.parse_args(argv)
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray
    from outer_trainers.distributed import connect_ray
    started = connect_ray(None, num_cpus=max(int(w) for w in args.workers.split(",")))
    try:
        print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load average "
              f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}, jax {jax.__version__}, ray {ray.__version__}\n")
        print("| problem | run | est/s | inner/s | worker ms/estimate | round ovh ms | step ovh ms | "
              "step ovh / estimate |")
        print("|---|---|---:|---:|---:|---:|---:|---:|")
        inner = 2 * NUM_TASKS * TRUNC
        for key in args.problems.split(","):
            label = problems()[key][0]
            results = [("local", bench_local(key, args.steps, args.warmup))]
            for w in (int(x) for x in args.workers.split(",")):
                results.append((f"Ray, {w} worker{'s' if w > 1 else ''}", bench_ray(key, w, args.steps, args.warmup)))
            for name, r in results:
                frac = r["step_overhead_ms"] / r["worker_ms"] if r["worker_ms"] else 0.0
                print(f"| {label} | {name} | {r['est_s']:.2f} | {r['est_s'] * inner:,.0f} | {r['worker_ms']:.1f} | "
                      f"{r['overhead_ms']:.1f} | {r['step_overhead_ms']:.1f} | {100 * frac:.0f}% |", flush=True)
        print("\n| theta | params | bytes | learner update ms/estimate | object-store round trip ms |")
        print("|---|---:|---:|---:|---:|")
        for name, n, nbytes, update_ms, put_ms in learner_costs():
            print(f"| {name} | {n} | {nbytes:,} | {update_ms:.3f} | {put_ms:.3f} |")
    finally:
        if started:
            ray.shutdown()


if __name__ == "__main__":
    main()

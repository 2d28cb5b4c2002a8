#!/usr/bin/env python
"""Benchmark gradient estimators against the floor of plain inner training.

For each problem — (a) QuadraticFamily dim 10, (b) dim 1000, (c) an MLP 64→32→10 on digits at
batch 128, (d) a sampled image-MLP family 64→128→128→128→10 (4 layers, 42,634 parameters, init
scale and activation sampled per task) at batch 128, the shape of Celo's meta-training tasks — and
each estimator (num_tasks=8, trunc_length=50, MLPLOpt or `--lopt AdafacMLPLOpt`), report:

  compile_s   first `estimate` call (trace + compile + run) minus one steady-state call
  s/estimate  median of >= 10 steady-state calls
  inner/s     inner steps per second (8 tasks × 50 steps × 2 antithetic = 800 per estimate)
  x floor     s/estimate ÷ the floor: the same 16 particles trained by the same learned
              optimizer for 50 steps in one jitted lax.scan (no perturbations, resets or meta-loss)

    python scripts/benchmark_estimators.py [--problems a,b,c,d] [--estimators TruncatedPES,...]
                                           [--lopt MLPLOpt,AdafacMLPLOpt] [--devices 1,all]
                                           [--rounds 2] [--repeats 10] [--markdown docs/benchmarks.md]

`--devices` sets the XLA CPU device count before jax starts: `all` is what the scripts use by
default (one device per core, `outer_trainers.use_all_cpu_cores`; TruncatedPES then shards its
pairs over them), `1` one device. With several settings (`--devices 1,all`) the script runs
itself once per setting and round, alternating (1, all, 1, all, ...: `--rounds`), and prints one
table with each row's min and median over the rounds' medians, so both settings see the same
machine conditions. The floor is a one-device program in every setting, so its rows also show
whether several devices slow down single-device work.

`--breakdown` instead times the parts of one TruncatedPES estimate, each jitted alone with the
estimators' options and interleaved with the floor: the unroll of the particles' TruncatedStep
(θ shared, then θ per particle), the perturbation draw (ε and the 2N perturbed θ), and all of it.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import jax
import optax

import lopt
from lopt.file_io import update_markdown_section
import outer_trainers as ot
from outer_trainers.steps import unroll as U
from outer_trainers.estimators import antithetic as A
import tasks

NUM_TASKS, TRUNC = 8, 50


def problems() -> dict:
    return {
        "a": ("quadratic dim 10", tasks.QuadraticFamily(dim=10)),
        "b": ("quadratic dim 1000", tasks.QuadraticFamily(dim=1000)),
        "c": ("MLP 64-32-10, batch 128", tasks.single_task_family(
            tasks.ImageMLPTask("digits", hidden_sizes=(32,), batch_size=128))),
        "d": ("image-MLP family 64-128-128-128-10, batch 128",
              tasks.ImageMLPFamily("digits", hidden_sizes=(128, 128, 128), batch_size=128)),
    }


def learned_optimizers() -> dict:
    """name -> LearnedOptimizer (default hyper-parameters) that `--lopt` can choose."""
    return {"MLPLOpt": lopt.MLPLOpt(), "AdafacMLPLOpt": lopt.AdafacMLPLOpt()}


def estimator_factories() -> dict:
    """name -> fn(truncated_step) -> estimator, for every estimator lopt ships.

    FullES/FullGrad unroll fresh episodes of `TRUNC` steps (the same work per estimate);
    TruncatedPESPMAP appears once per local device count it can use (1, 2, 4, ...).
    """
    n, K = NUM_TASKS, TRUNC
    out = {
        "TruncatedPES": lambda s: ot.TruncatedPES(s, n, K, std=0.01),
        "TruncatedES": lambda s: ot.TruncatedES(s, n, K, std=0.01),
        "NoiseReuseES": lambda s: ot.NoiseReuseES(s, n, K, std=0.01),
        "TruncatedGrad": lambda s: ot.TruncatedGrad(s, n, K),
        "FullES": lambda s: ot.FullES(s, n, K, std=0.01),
        "FullGrad": lambda s: ot.FullGrad(s, n, K),
    }
    d = 1
    while d <= jax.local_device_count() and n % d == 0:
        out[f"TruncatedPESPMAP[{d} dev]"] = (lambda d: lambda s: ot.TruncatedPESPMAP(s, n, K, std=0.01,
                                                                                     num_devices=d))(d)
        d *= 2
    return out


def _block(tree):
    return jax.block_until_ready(tree)


def time_calls(fns: dict, repeats: int) -> dict:
    """{name: (first-call seconds, median steady-state seconds)}; steady-state calls of all fns
    are interleaved so machine drift hits each alike (their ratios stay meaningful)."""
    first, times = {}, {k: [] for k in fns}
    for k, fn in fns.items():
        t = time.perf_counter()
        _block(fn())
        first[k] = time.perf_counter() - t
    for _ in range(repeats):
        for k, fn in fns.items():
            t = time.perf_counter()
            _block(fn())
            times[k].append(time.perf_counter() - t)
    return {k: (first[k], statistics.median(times[k])) for k in fns}


def floor_fn(family, learned_opt, theta, num_particles: int, num_steps: int):
    """Jitted: `num_particles` tasks trained by `learned_opt` for `num_steps` in one lax.scan.

    Deliberately the bare loop rather than `train_model.train_step`: one key per step used as is
    (no per-step split), no finiteness test, no resets, so × floor charges an estimator for all
    of its own work. Each particle has its own copy of theta, as the estimators' particles have
    their own perturbed theta (so the learned optimizer's products are batched alike)."""
    data = family.data

    def one(theta, key, data):
        cfg = family.sample(key)
        task = family.task_fn(cfg)
        params, ms = task.init_with_state(key)
        tx = learned_opt.opt_fn(theta, is_training=True)
        opt_state = tx.init(params)

        def body(carry, k):
            params, ms, opt_state = carry
            batch = data.batch(k, "train") if data is not None else None
            (loss, ms), g = jax.value_and_grad(task.loss_with_state, has_aux=True)(params, ms, k, batch)
            upd, opt_state = tx.update(g, opt_state, params, loss=loss)
            return (optax.apply_updates(params, upd), ms, opt_state), loss

        _, losses = jax.lax.scan(body, (params, ms, opt_state), jax.random.split(key, num_steps))
        return losses.mean()

    # each particle its own copy of theta, as the estimators' perturbed particles have; compiled with
    # the estimators' options, so × floor measures estimator overhead alone
    per_particle = jax.tree_util.tree_map(lambda t: jax.numpy.broadcast_to(t, (num_particles,) + t.shape), theta)
    run = jax.jit(jax.vmap(one, in_axes=(0, 0, None)), compiler_options=ot.default_compiler_options() or None)
    keys = jax.random.split(jax.random.key(0), num_particles)
    return lambda: run(per_particle, keys, data)


def make_call(est, theta, num_calls: int):
    """A no-arg fn running one `estimate` (state carried between calls, a fresh key each call).
    The `num_calls` keys are made up front, as an outer loop would, so the timed call is the
    estimate alone (making a key from a Python int is itself a ~25 µs dispatch)."""
    keys = list(jax.random.split(jax.random.key(1), num_calls))
    holder = {"state": est.init_state(theta, jax.random.key(0)), "i": 0}

    def call():
        holder["i"] += 1
        holder["state"], e = est.estimate(theta, holder["state"], keys[holder["i"] % num_calls])
        return e.grad

    return call


def bench(problem_keys, estimator_names, repeats, lopt_name: str = "MLPLOpt"):
    rows = []
    lo = learned_optimizers()[lopt_name]
    theta = lo.init(jax.random.key(0))
    factories = estimator_factories()
    all_problems = problems()
    for pk in problem_keys:
        label, family = all_problems[pk]
        sched = ot.LogUniformTruncationSchedule(100, 1000)
        step = ot.LOptTruncatedStep(family, lo, sched)
        floor = floor_fn(family, lo, theta, 2 * NUM_TASKS, TRUNC)
        fns = {"floor (jitted scan)": floor}
        ests = {}
        for name in estimator_names:
            if name not in factories:
                print(f"skipping unknown estimator {name}")
                continue
            est = factories[name](step)
            ests[name] = est
            fns[name] = make_call(est, theta, repeats + 1)
        timed = time_calls(fns, repeats)
        f_med = timed["floor (jitted scan)"][1]
        for name, (first, med) in timed.items():
            inner = ests[name].inner_steps_per_estimate if name in ests else 2 * NUM_TASKS * TRUNC
            rows.append(dict(problem=label, estimator=name, compile_s=first - med, sec=med, inner=inner / med,
                             ratio=med / f_med, lopt=lopt_name, devices=jax.local_device_count()))
            print(f"{label:28s} {name:20s} compile {first - med:6.2f}s  {med * 1e3:8.2f} ms  "
                  f"{inner / med:10.0f} inner/s  {med / f_med:5.2f}x floor", flush=True)
    return rows


def breakdown_fns(step, theta, num_calls: int) -> dict:
    """{part: no-arg fn} for the parts of a TruncatedPES(step, NUM_TASKS, TRUNC) estimate.

    Each part starts from the same PES state (the unroll-only parts do not carry it on) and is
    compiled with `ot.default_compiler_options()`, like the estimator it is part of."""
    n, K, std = NUM_TASKS, TRUNC, 0.01
    est = ot.TruncatedPES(step, n, K, std=std)
    state = est.init_state(theta, jax.random.key(0))
    jit = lambda f: jax.jit(f, compiler_options=ot.default_compiler_options() or None)
    per_particle = lambda th: jax.tree_util.tree_map(lambda t: jax.numpy.broadcast_to(t, (2 * n,) + t.shape), th)
    parts = {
        "unroll only, θ shared": jit(lambda th, s, k: U.unroll(step, th, s.inner_state, k, K, theta_batched=False,
                                                                reset_groups=2, data=step.data_args())),
        "unroll only, θ per particle": jit(lambda th, s, k: U.unroll(step, per_particle(th), s.inner_state, k, K,
                                                                      reset_groups=2, data=step.data_args())),
        "perturbation draw (ε, θ ± ε)": jit(lambda th, s, k: A.tree_stack_pm(
            th, A.sample_perturbations(th, jax.random.split(k)[0], n, std))),
    }
    keys = list(jax.random.split(jax.random.key(1), num_calls))
    fns = {name: (lambda f: lambda: f(theta, state, keys[0]))(f) for name, f in parts.items()}
    fns["TruncatedPES (all of it)"] = make_call(est, theta, num_calls)
    return fns


def bench_breakdown(problem_keys, repeats):
    rows = []
    lo = lopt.MLPLOpt()
    theta = lo.init(jax.random.key(0))
    for pk in problem_keys:
        label, family = problems()[pk]
        step = ot.LOptTruncatedStep(family, lo, ot.LogUniformTruncationSchedule(100, 1000))
        fns = {"floor (jitted scan)": floor_fn(family, lo, theta, 2 * NUM_TASKS, TRUNC),
               **breakdown_fns(step, theta, repeats + 1)}
        timed = time_calls(fns, repeats)
        f_med = timed["floor (jitted scan)"][1]
        for name, (first, med) in timed.items():
            rows.append(dict(problem=label, part=name, sec=med, ratio=med / f_med))
            print(f"{label:28s} {name:32s} {med * 1e3:8.3f} ms  {med / f_med:5.2f}x floor", flush=True)
    return rows


def breakdown_markdown(rows) -> str:
    head = "| problem | part | ms | × floor |\n|---|---|---|---|"
    body = [f"| {r['problem']} | {r['part']} | {r['sec'] * 1e3:.3f} | {r['ratio']:.2f} |" for r in rows]
    return "\n".join([head] + body)


def to_markdown(rows) -> str:
    head = ("| problem | estimator | compile (s) | ms / estimate | inner steps/s | × floor |\n"
            "|---|---|---|---|---|---|")
    body = [f"| {r['problem']} | {r['estimator']} | {r['compile_s']:.2f} | {r['sec'] * 1e3:.2f} | "
            f"{r['inner']:,.0f} | {r['ratio']:.2f} |" for r in rows]
    return "\n".join([head] + body)


def combine_rounds(rows_per_run: list) -> list:
    """Rows of several runs (rounds × device settings) -> one row per (problem, optimizer, estimator,
    devices): compile time, min and median over the runs of each run's median seconds."""
    groups = {}
    for rows in rows_per_run:
        for r in rows:
            groups.setdefault((r["problem"], r["lopt"], r["estimator"], r["devices"]), []).append(r)
    out = []
    for (problem, lo, est, dev), rs in groups.items():
        secs = sorted(r["sec"] for r in rs)
        med = statistics.median(secs)
        out.append(dict(problem=problem, lopt=lo, estimator=est, devices=dev,
                        compile_s=statistics.median(r["compile_s"] for r in rs), sec_min=secs[0], sec=med,
                        inner=statistics.median(r["inner"] * r["sec"] for r in rs) / med,
                        ratio=statistics.median(r["ratio"] for r in rs), runs=len(rs)))
    order = {k: i for i, k in enumerate(dict.fromkeys((r["problem"], r["lopt"]) for r in out))}
    return sorted(out, key=lambda r: (order[(r["problem"], r["lopt"])], r["estimator"] != "floor (jitted scan)",
                                      r["estimator"], r["devices"]))


def combined_markdown(rows) -> str:
    head = ("| problem | optimizer | estimator | devices | compile (s) | ms / estimate (min / median) | "
            "inner steps/s | × floor |\n|---|---|---|---|---|---|---|---|")
    body = [f"| {r['problem']} | {r['lopt']} | {r['estimator']} | {r['devices']} | {r['compile_s']:.2f} | "
            f"{r['sec_min'] * 1e3:.2f} / {r['sec'] * 1e3:.2f} | {r['inner']:,.0f} | {r['ratio']:.2f} |" for r in rows]
    return "\n".join([head] + body)


def _set_devices(setting: str) -> None:
    """Fix the CPU device count before jax starts: "all" as the scripts do, or a number."""
    if setting == "all":
        ot.use_all_cpu_cores()
    elif int(setting) > 1 or "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
        jax.config.update("jax_num_cpu_devices", int(setting))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--problems", default="a,b,c")
    p.add_argument("--estimators", default="TruncatedPES,TruncatedES",
                   help="comma-separated names, or 'all' (see estimator_factories)")
    p.add_argument("--lopt", default="MLPLOpt", help="comma-separated learned optimizers (see learned_optimizers)")
    p.add_argument("--devices", default=None,
                   help="CPU devices: 'all' (one per core, the scripts' default), a number, or several "
                        "settings ('1,all') run alternately in subprocesses; default: leave jax's choice")
    p.add_argument("--rounds", type=int, default=1, help="alternations of the --devices settings")
    p.add_argument("--title", default=None, help="Markdown section title (default: Estimators (<platform>))")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--markdown", default=None, help="write the table into this Markdown file's section")
    p.add_argument("--note", default="", help="conditions of the run, written under the table")
    p.add_argument("--breakdown", action="store_true", help="time the parts of a TruncatedPES estimate instead")
    p.add_argument("--json", default=None, help=argparse.SUPPRESS)  # one subprocess run's rows
    args = p.parse_args()
    settings = args.devices.split(",") if args.devices else []
    if len(settings) > 1 or args.rounds > 1:
        return _alternate(args, settings or ["all"])
    if settings:
        _set_devices(settings[0])
    if args.breakdown:
        table = breakdown_markdown(bench_breakdown(args.problems.split(","), args.repeats))
        print(table)
        if args.markdown:
            title = args.title or "Where a PES estimate's time goes"
            update_markdown_section(args.markdown, f"## {title}\n\n{_env(args.repeats)} {args.note}\n\n{table}\n")
        return
    names = list(estimator_factories()) if args.estimators == "all" else args.estimators.split(",")
    rows = [r for name in args.lopt.split(",") for r in bench(args.problems.split(","), names, args.repeats, name)]
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh)
        return
    table = to_markdown(rows)
    print(table)
    if args.markdown:
        title = args.title or f"Estimators ({jax.devices()[0].platform})"
        update_markdown_section(args.markdown, f"## {title}\n\n{_env(args.repeats)} {args.note}\n\n{table}\n")


def _alternate(args, settings) -> None:
    """Run this script once per device setting and round, alternating; print one combined table."""
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for rnd in range(args.rounds):
            for setting in settings:
                out = os.path.join(tmp, f"{rnd}-{setting}.json")
                cmd = [sys.executable, os.path.abspath(__file__), "--problems", args.problems, "--estimators",
                       args.estimators, "--lopt", args.lopt, "--devices", setting, "--repeats", str(args.repeats),
                       "--json", out]
                print(f"round {rnd + 1}/{args.rounds}, devices={setting}", flush=True)
                subprocess.run(cmd, check=True)
                with open(out) as fh:
                    runs.append(json.load(fh))
    table = combined_markdown(combine_rounds(runs))
    print(table)
    if args.markdown:
        title = args.title or f"Estimators ({jax.devices()[0].platform}), devices {' vs '.join(settings)}"
        env = _env(args.repeats).rsplit(" median of", 1)[0]
        note = (f"{env}; each row: min / median over {args.rounds} rounds of each run's median of {args.repeats} "
                f"calls, device settings {', '.join(settings)} run alternately.")
        update_markdown_section(args.markdown, f"## {title}\n\n{note} {args.note}\n\n{table}\n")


def _env(repeats: int) -> str:
    dev = jax.devices()[0]
    return (f"jax {jax.__version__}, {dev.platform} ({dev.device_kind}), {os.cpu_count()} cores, "
            f"{platform.processor() or platform.machine()}; {NUM_TASKS} tasks, trunc_length {TRUNC}, "
            f"LogUniform(100, 1000) episodes; median of {repeats}. {jax.local_device_count()} local device(s).")


if __name__ == "__main__":
    main()

"""Time one optimizer update of each lopt learned optimizer against optax.adam.

    python scripts/benchmark_optimizers.py                      # 1M and 10M params, writes docs/benchmarks.md
    python scripts/benchmark_optimizers.py --sizes 1M --repeats 30 --no-write

For each model size and optimizer, two things are compiled, warmed up, then timed `--repeats`
times (≥ 20), the optimizers and the two measures interleaved round-robin so a noisy neighbour
slows them all alike: `jax.jit(tx.update)`, whose outputs are fresh buffers, and a training step
(`tx.update` then `optax.apply_updates`) jitted with the parameters and the optimizer state
donated, as a training loop that donates them runs it. The two differ most for big tensors: a
fresh output buffer of tens of MB is page-faulted in on every call, one 4 KiB page at a time,
which a donated step, writing in place, never pays. The medians are
reported with their ratios to Adam's and the bytes of optimizer state per parameter. Each sample
is one call (`--burst 1`, the default): it starts with cold caches, as an update after a
forward/backward pass does. `--burst K` times the mean of K back-to-back calls instead, which
keeps a 1M-parameter model's inputs in cache and so flatters memory-bound Adam most. The machine's f32 matmul throughput (median of a big square
matmul) gives MLPLOpt's FLOP floor: 2 · (its per-parameter MLP multiply-adds) · N / throughput.
Its GEMM floor is measured instead: the time of its three GEMMs alone,
[H, F] @ [F, c], [H, H] @ [H, c], [2, H] @ [H, c], over all N parameters in blocks of c
(`gemm_floor_call`, writing into a donated buffer like the train step), timed interleaved with
the optimizers at each block size of `GEMM_BLOCKS`; the floor is the fastest of them
(`best_gemm_floor`), i.e. at the throughput this machine reaches for those shapes.
The result replaces the "## Optimizer step" section of docs/benchmarks.md (other sections kept), or
the section `--title` names (e.g. "## Optimizer step (GPU)" for figures from a GPU).
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from typing import Callable, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import optax

import lopt
import lopt.parts.layout
import lopt.pretrained
from lopt.file_io import update_markdown_section

SECTION = "## Optimizer step"
# layer widths of an MLP whose weights make the model: ~1.0M and ~9.5M parameters
MODELS = {"1M": (784, 1024, 192, 10), "10M": (3072, 2048, 1536, 10)}
# block sizes at which `best_gemm_floor` times MLPLOpt's GEMMs
GEMM_BLOCKS = (1024, 4096, 16384, 32768, 65536)
# the shipped optimizers timed: the recommended one first, then the cheap-on-CPU one and two older Celo2LOpts
SHIPPED = (lopt.pretrained.RECOMMENDED, "normmlp_v3", "celo2_v4", "celo2_v7")


def model_params(widths: Sequence[int], key: jax.Array) -> dict:
    """The weights of a float32 MLP, the model whose update is timed.

    Args:
      widths: layer widths, input first (e.g. `MODELS["1M"]`).
      key: PRNG key of the weights (normal, scaled by 1/sqrt(fan-in); biases zero).

    Returns:
      `{"dense_i": {"w": [a, b], "b": [b]}}` for each consecutive pair (a, b) of widths.
    """
    params = {}
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        key, k = jax.random.split(key)
        params[f"dense_{i}"] = {"w": jax.random.normal(k, (a, b), jnp.float32) / a ** 0.5,
                                "b": jnp.zeros((b,), jnp.float32)}
    return params


def platform_layout() -> str:
    """The update layout of the platform jax computes on here: "cpu" or "accelerator"."""
    return lopt.parts.layout.for_platform(jax.default_backend())


def optimizers() -> dict[str, optax.GradientTransformation]:
    """The benchmarked optimizers by name: optax.adam(1e-3), optax.contrib.muon(0.02) (Newton–Schulz
    on the weight matrices, Adam on the biases), each learned optimizer at its initial theta, and the
    shipped meta-trained optimizers a user loads (`lopt.pretrained.load(name, num_steps=1000)`:
    `lopt.pretrained.RECOMMENDED` ("celo2_v9"); "normmlp_v3", a NormMLPLOpt; "celo2_v4", a Celo2LOpt; and
    "celo2_v7", `celo2_v5`'s theta with the weight-decay and no-growth rules on). Every learned optimizer takes the
    update layout of this machine's platform (`lopt.parts.layout.for_platform`), as `load` does."""
    out = {"optax.adam": optax.adam(1e-3), "optax.contrib.muon": optax.contrib.muon(0.02)}
    layout = platform_layout()
    for lo in [lopt.MLPLOpt(layout=layout), lopt.AdafacMLPLOpt(layout=layout), lopt.RNNMLPLOpt(layout=layout),
               lopt.NNAdam(), lopt.HyperLOpt(layout=layout), lopt.Celo2LOpt(layout=layout)]:
        out[lo.name] = lo.opt_fn(lo.init(jax.random.key(0)))
    for name in SHIPPED:
        out[f"pretrained:{name}"] = lopt.pretrained.load(name, num_steps=1000)
    return out


def mlp_lopt_macs(lo: lopt.MLPLOpt) -> int:
    """Per-parameter multiply-adds of MLPLOpt's MLP (features -> hidden layers -> 2 outputs).

    Args:
      lo: the MLPLOpt whose `num_features`, `hidden_size` and `hidden_layers` count.

    Returns:
      the multiply-adds of one parameter's MLP evaluation.
    """
    h = lo.hidden_size
    return lo.num_features * h + (lo.hidden_layers - 1) * h * h + 2 * h


def _time(fn: Callable, args: tuple) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - start


def matmul_flops_per_s(n: int = 2048, repeats: int = 10) -> float:
    """This machine's float32 matmul throughput, from a jitted square matmul.

    Args:
      n: the matrices' size: [n, n] @ [n, n].
      repeats: timed calls (after one warm-up call).

    Returns:
      FLOP/s: 2n³ over the median time of a call.
    """
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    f = jax.jit(lambda x, y: x @ y)
    jax.block_until_ready(f(a, a))
    return 2 * n ** 3 / statistics.median(_time(f, (a, a)) for _ in range(repeats))


def gemm_floor_call(lo: lopt.MLPLOpt, n: int) -> Callable[[], jax.Array]:
    """A compiled, warmed-up call of MLPLOpt's three GEMMs alone on n parameters, in its blocks of
    `lo.block_size(n)` parameters.

    Each block computes W3ᵀ (W2ᵀ (W1ᵀ x)) on a [F, c] slice of a random [F, n] input (an
    optimization barrier between the layers keeps XLA from re-associating the chain) and writes
    the [2, c] result in place into a [2, n] output, as MLPLOpt's blocks do; no features, ReLU or
    accumulators. The output buffer is donated and carried from call to call, so, like a donated
    train step, the floor pays no page faults for a fresh output.

    Args:
      lo: the MLPLOpt whose `num_features`, `hidden_size`, `hidden_layers` and `block_size(n)` count.
      n: the number of parameters.

    Returns:
      A no-argument function running the GEMMs once and returning the output.
    """
    from lopt.parts.layout import block_starts
    f, h, c = lo.num_features, lo.hidden_size, lo.block_size(n)
    ks = jax.random.split(jax.random.key(0), 4)
    x = jax.random.normal(ks[0], (f, n), jnp.float32)
    w1 = jax.random.normal(ks[1], (h, f), jnp.float32)
    wh = jax.random.normal(ks[2], (h, h), jnp.float32)
    w3 = jax.random.normal(ks[3], (2, h), jnp.float32)
    starts = block_starts(n, c)

    def gemms(out, x, w1, wh, w3):
        def block(i, out):
            y = jax.lax.optimization_barrier(w1 @ jax.lax.dynamic_slice_in_dim(x, starts[i], c, axis=1))
            for _ in range(lo.hidden_layers - 1):
                y = jax.lax.optimization_barrier(wh @ y)
            return jax.lax.dynamic_update_slice_in_dim(out, w3 @ y, starts[i], axis=1)
        return jax.lax.fori_loop(0, starts.shape[0], block, out)

    fn = jax.jit(gemms, donate_argnums=0)
    out = [jax.block_until_ready(fn(jnp.zeros((2, n), jnp.float32), x, w1, wh, w3))]

    def call():
        out[0] = fn(out[0], x, w1, wh, w3)
        return out[0]

    return call


class Timing(NamedTuple):
    """One optimizer's figures on one model size.

    Attributes:
      update_s: median seconds of one jitted `tx.update` whose outputs are fresh buffers.
      step_s: median seconds of one jitted training step, `tx.update` then `optax.apply_updates`,
        with the parameters and the optimizer state donated (written in place), as a training
        loop that donates them runs it.
      state_bytes: bytes of optimizer state per parameter.
    """
    update_s: float
    step_s: float
    state_bytes: float


def bench_size(widths: Sequence[int], repeats: int, burst: int = 1,
               floor_blocks: Sequence[int] = ()) -> tuple[int, dict[str, Timing], dict[int, float]]:
    """Times every optimizer on one model size, the optimizers interleaved: its jitted `tx.update`
    (fresh output buffers) and its donated training step (see `Timing`); and, interleaved with
    them, MLPLOpt's GEMM floor (`gemm_floor_call`) at each of `floor_blocks`.

    Args:
      widths: the MLP's layer widths (see `model_params`).
      repeats: timed samples per optimizer and measure.
      burst: back-to-back calls per sample; a sample is their mean time.
      floor_blocks: the block sizes at which the GEMM floor is timed (none: no floor).

    Returns:
      `(number of parameters, {optimizer name: Timing}, {block: median seconds of the GEMM floor})`.
    """
    params = model_params(widths, jax.random.key(0))
    grads = jax.tree_util.tree_map(lambda p: 0.01 * jnp.cos(p), params)
    n = sum(x.size for x in jax.tree_util.tree_leaves(params))
    runs = {}
    for name, tx in optimizers().items():
        state = tx.init(params)
        update = jax.jit(lambda g, s, p, tx=tx: tx.update(g, s, p, loss=jnp.asarray(1.0)))
        jax.block_until_ready(update(grads, state, params))

        def train_step(p, s, g, tx=tx):
            u, s = tx.update(g, s, p, loss=jnp.asarray(1.0))
            return optax.apply_updates(p, u), s

        step = jax.jit(train_step, donate_argnums=(0, 1))
        carry = list(jax.block_until_ready(step(jax.tree_util.tree_map(jnp.copy, params), tx.init(params), grads)))
        state_bytes = sum(x.nbytes for x in jax.tree_util.tree_leaves(state))
        runs[name] = dict(update=update, args=(grads, state, params), step=step, carry=carry,
                          state_bytes=state_bytes / n, update_times=[], step_times=[])
    floors = {c: dict(call=gemm_floor_call(lopt.MLPLOpt(chunk_size=c), n), times=[]) for c in floor_blocks}
    for _ in range(repeats):
        for r in runs.values():
            start = time.perf_counter()
            for _ in range(burst):
                out = r["update"](*r["args"])
            jax.block_until_ready(out)
            r["update_times"].append((time.perf_counter() - start) / burst)
            carry = r["carry"]
            start = time.perf_counter()
            for _ in range(burst):
                carry[:] = r["step"](carry[0], carry[1], grads)
            jax.block_until_ready(carry)
            r["step_times"].append((time.perf_counter() - start) / burst)
        for f in floors.values():
            f["times"].append(_time(f["call"], ()))
    timings = {name: Timing(statistics.median(r["update_times"]), statistics.median(r["step_times"]), r["state_bytes"])
               for name, r in runs.items()}
    return n, timings, {c: statistics.median(f["times"]) for c, f in floors.items()}


def best_gemm_floor(lo: lopt.MLPLOpt, n: int, floors: dict[int, float]) -> tuple[int, float, float]:
    """MLPLOpt's GEMM floor at the block size where this machine runs its three GEMMs fastest.

    Args:
      lo: the MLPLOpt (its `num_features`, `hidden_size` and `hidden_layers` count).
      n: the number of parameters.
      floors: `{block size: seconds}` of the GEMM floor (`bench_size`'s third result).

    Returns:
      (the fastest block size, its seconds, the GEMMs' FLOP/s there).
    """
    best = min(floors, key=floors.get)
    return best, floors[best], 2 * mlp_lopt_macs(lo) * n / floors[best]


def machine() -> str:
    """Where the benchmark runs, in words: the accelerator JAX computes on (if any), the CPU cores,
    and jax's version."""
    cpu = f"{os.cpu_count()} CPU cores ({platform.machine()})"
    device = jax.devices()[0]
    if device.platform == "cpu":
        return f"{cpu}, jax {jax.__version__}"
    return f"one {device.device_kind} ({device.platform}) beside {cpu}, jax {jax.__version__}"


def render(results: dict, flops: float, repeats: int, note: str, burst: int = 1,
           gemm_floors: Optional[dict] = None, title: str = SECTION) -> str:
    """The "## Optimizer step" Markdown section: the timing table and MLPLOpt's floor table.

    Args:
      results: `{size name: (number of parameters, {optimizer name: Timing})}` (`bench_size`'s first two results).
      flops: the machine's matmul throughput in FLOP/s (`matmul_flops_per_s`).
      repeats: timed samples per optimizer (stated in the text).
      note: conditions to record in the text (may be empty).
      burst: back-to-back calls per sample (stated in the text).
      gemm_floors: `{size name: best_gemm_floor(...)}`, or None (the GEMM-floor columns then read nan).
      title: the section's heading line.

    Returns:
      the section's Markdown, ending with a newline.
    """
    lo = lopt.MLPLOpt(layout=platform_layout())
    floor_macs = mlp_lopt_macs(lo)
    biggest = max(a * b for widths in MODELS.values() for a, b in zip(widths[:-1], widths[1:]))
    big_block = lo.block_size(biggest)  # 32768 with the CPU layout, 2^22 with the accelerator layout
    lines = [title, "",
             f"Median of {repeats} samples, each "
             f"{'one call' if burst == 1 else f'the mean of {burst} back-to-back calls'} (optimizers and measures "
             f"interleaved), float32 MLP models: \"update\" is one jitted `tx.update` writing fresh buffers; "
             f"\"train step\" is one jitted `tx.update` + `optax.apply_updates` with the parameters and the "
             f"optimizer state donated, as a training loop that donates them runs it. "
             f"Machine: {machine()}; "
             f"measured f32 matmul throughput {flops / 1e9:.0f} GFLOP/s. {note}".rstrip(), "",
             "| model | optimizer | ms / update | × Adam | ms / train step | × Adam | state bytes / param |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for size, (n, res) in results.items():
        adam = res["optax.adam"]
        for name, t in res.items():
            lines.append(f"| {size} ({n:,}) | {name} | {t.update_s * 1e3:.2f} | {t.update_s / adam.update_s:.1f} | "
                         f"{t.step_s * 1e3:.2f} | {t.step_s / adam.step_s:.1f} | {t.state_bytes:.1f} |")
    lines += ["", f"MLPLOpt's floors: the FLOP floor = 2 × {floor_macs} multiply-adds/param × N ÷ the square-matmul "
                  "throughput; the GEMM floor (the bar: MLPLOpt within 1.5× of it) = its three "
                  "GEMMs alone (`gemm_floor_call`, writing in place into a donated buffer), timed interleaved with the "
                  "optimizers at the block size, of "
                  f"{', '.join(str(c) for c in GEMM_BLOCKS)}, where this machine runs them fastest, with the "
                  "throughput they reach there; MLPLOpt itself runs a tensor of n parameters in blocks of "
                  f"the layout's `block_size(n)` ({big_block} for the biggest matrix on this machine). "
                  "AdafacMLPLOpt target ≤ 8× Adam.", "",
              "| model | MLPLOpt ms (update / train step) | × FLOP floor | GEMM floor ms (block, GFLOP/s) "
              "| × GEMM floor (update / train step) | AdafacMLPLOpt × Adam (update / train step) |",
              "|---|---:|---:|---:|---:|---:|"]
    for size, (n, res) in results.items():
        floor = 2 * floor_macs * n / flops
        t, adam, ada = res["MLPLOpt"], res["optax.adam"], res["AdafacMLPLOpt"]
        block, g_t, g_flops = gemm_floors[size] if gemm_floors and size in gemm_floors else (0,) + (float("nan"),) * 2
        lines.append(f"| {size} | {t.update_s * 1e3:.2f} / {t.step_s * 1e3:.2f} | {t.update_s / floor:.2f} | "
                     f"{g_t * 1e3:.2f} ({block}, {g_flops / 1e9:.0f}) | {t.update_s / g_t:.2f} / {t.step_s / g_t:.2f} | "
                     f"{ada.update_s / adam.update_s:.1f} / {ada.step_s / adam.step_s:.1f} |")
    celo = [name for name in ("Celo2LOpt", *(f"pretrained:{n}" for n in SHIPPED if n.startswith("celo2")))
            if all(name in res for _, res in results.values())]
    if celo:
        lines += ["", "Celo2LOpt orthogonalizes its weight matrices' updates as Muon does; its target is ≤ 2× Muon's step.", "",
                  "| model | " + " | ".join(f"{name} ÷ optax.contrib.muon (update / train step)" for name in celo) + " |",
                  "|---|" + "---:|" * len(celo)]
        for size, (n, res) in results.items():
            m = res["optax.contrib.muon"]
            lines.append(f"| {size} | " + " | ".join(f"{res[c].update_s / m.update_s:.2f} / {res[c].step_s / m.step_s:.2f}"
                                                      for c in celo) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> dict:
    """Runs the benchmark from the command line (`argv`, default `sys.argv[1:]`; see `--help`).

    Prints the section and, unless `--no-write`, writes it into `--out`.

    Returns:
      `{size name: bench_size(...)}` (number of parameters, timings, GEMM floors by block).
    """
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1M,10M", help=f"comma-separated, from {sorted(MODELS)}")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--burst", type=int, default=1, help="back-to-back calls per timed sample")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "docs", "benchmarks.md"))
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--note", default="", help="conditions to record (e.g. 'CPU shared with other jobs')")
    ap.add_argument("--title", default=SECTION, help="the section's heading, replaced in --out (e.g. '## Optimizer step (GPU)')")
    args = ap.parse_args(argv)
    flops = matmul_flops_per_s()
    timed = {s: bench_size(MODELS[s], args.repeats, args.burst, GEMM_BLOCKS) for s in args.sizes.split(",")}
    results = {s: (n, res) for s, (n, res, _) in timed.items()}
    gemm_floors = {s: best_gemm_floor(lopt.MLPLOpt(layout=platform_layout()), n, floors) for s, (n, _, floors) in timed.items()}
    section = render(results, flops, args.repeats, args.note, args.burst, gemm_floors, args.title)
    print(section)
    if not args.no_write:
        update_markdown_section(args.out, section)
    return timed


if __name__ == "__main__":
    main()

"""Scale check: a ~20M-parameter byte-level transformer LM trained by learned optimizers and by tuned AdamW.

    python scripts/benchmark_lm_scale.py --output lm_scale.md        # the GPU run: 3 AdamW rates + 2 learned
    python scripts/benchmark_lm_scale.py --dry_run                   # builds everything, prints size, tokens, FLOPs
    python scripts/benchmark_lm_scale.py --size tiny --optimizer adamw --adamw_lrs 1e-3,1e-2 --output /tmp/t.md

The model is lopt's `tasks.language.ByteTransformerTask` (pre-LayerNorm causal transformer,
vocabulary 256) sized by `--size`: "20M" (d_model 512, 8 heads, 6 layers, windows of 256 bytes:
19,308,288 parameters) or "tiny" (5,360, for the CPU test). Every optimizer trains the same initial
parameters on the same batches: tokens = steps × batch_size × seq_len, fixed for all.

Data, read from disk, never downloaded (`--data`): "python_stdlib" (default), the .py files of
this Python's standard library (site-packages and tests left out), real text split by file:
validation where crc32(relative path) % 20 == 0, test where == 1, train otherwise; or
"grammar_text", lopt's procedural corpus (4 MB, 90/5/5 contiguous), the same bytes everywhere.
Train windows start every seq_len/4 bytes; held-out ones do not overlap.

Optimizers (`--optimizer`, repeatable): "adamw", tuned over `--adamw_lrs` (peak rates of a linear
warm-up over 5% of the steps and a cosine decay to 0.1 × peak; b2 0.95, weight decay 0.1 on every
parameter of rank ≥ 2, global-norm clip 1), the best chosen on final validation loss; or a learned
one named as for `scripts/evaluate.py` ("pretrained:NAME", "published:NAME", a theta or checkpoint
file), loaded by `outer_trainers.evaluation.optimizer_specs`, told the horizon `--steps`, not
tuned. Each run is one jitted train step with donated state, timed after its first (compiling)
call; held-out losses (nats per byte) are a jitted mean over `--valid_batches` fixed batches. A
run whose train loss turns non-finite (checked every 100 steps) stops and reads "diverged".

Budget: FLOPs per run ≈ 6 × params × tokens + 12 × layers × context × d_model × tokens (attention
scores). At the 20M defaults (2000 × 32 × 256 = 16,384,000 tokens) that is 2.04e15 per run,
1.02e16 for 5 runs: at an assumed 40 TFLOP/s effective on one H100/H200-class GPU (float32 at
jax's default matmul precision; docs/benchmarks.md measured 107 TFLOP/s for a large f32 matmul on
the H100), 4.3 minutes of training, plus ~20 s of compilation per run and the learned optimizers'
dearer updates: about 6–7 minutes, under 10 at 25 TFLOP/s. An estimate, not a measurement:
`--dry_run` prints it for other settings, each run reports its TFLOP/s, and `--output` is
rewritten after every run, so a run cut short keeps its finished rows.
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import math
import os
import sys
import sysconfig
import time
import zlib
from typing import NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from lopt.file_io import atomic_write_bytes
from lopt.pretrained import RECOMMENDED
from outer_trainers import default_compiler_options
from outer_trainers.evaluation.optimizer_specs import learned_tx, optimizer_labels, resolve_optimizer
from tasks.datasets.data_source import DataSource
from tasks.language import ByteTransformerTask

SIZES = {  # model and default budget of each --size
    "20M": dict(d_model=512, num_heads=8, num_layers=6, seq_len=256, batch_size=32, steps=2000),
    "tiny": dict(d_model=8, num_heads=2, num_layers=1, seq_len=16, batch_size=4, steps=6),
}
DATA = ("python_stdlib", "grammar_text")
SKIP_DIRS = ("site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test")
DEFAULT_OPTIMIZERS = ("adamw", f"pretrained:{RECOMMENDED}", "pretrained:celo2_v5")  # celo2_v5: its theta, 2 rules
CHECK_EVERY = 100  # steps between checks for a non-finite train loss


def corpus(name: str) -> tuple[dict, str]:
    """The train / validation / test bytes of a local corpus (see the module docstring) and its description.

    Args:
      name: "python_stdlib" or "grammar_text".

    Returns:
      ({"train": bytes, "valid": bytes, "test": bytes}, a sentence naming the source, its size and SHA-256).
    """
    if name == "grammar_text":
        from tasks.suites.texts import grammar_text
        raw = grammar_text(4_000_000)
        parts = {"train": raw[:3_600_000], "valid": raw[3_600_000:3_800_000], "test": raw[3_800_000:]}
        what = "grammar_text (lopt's procedural English-like corpus, 4,000,000 bytes, 90/5/5 contiguous)"
    elif name == "python_stdlib":
        root = sysconfig.get_paths()["stdlib"]
        chunks, count = {"train": [], "valid": [], "test": []}, 0
        for d, dirs, files in os.walk(root):
            dirs[:] = sorted(x for x in dirs if x not in SKIP_DIRS)
            for f in sorted(files):
                if f.endswith(".py"):
                    rel = os.path.relpath(os.path.join(d, f), root)
                    split = {0: "valid", 1: "test"}.get(zlib.crc32(rel.encode()) % 20, "train")
                    with open(os.path.join(d, f), "rb") as fh:
                        chunks[split].append(fh.read())
                    count += 1
        if not chunks["valid"] or not chunks["test"]:
            raise ValueError(f"python_stdlib: {count} .py files under {root}, too few; use --data grammar_text")
        parts = {k: b"".join(v) for k, v in chunks.items()}
        what = (f"python_stdlib (the {count} .py files of Python {sys.version.split()[0]}'s standard library "
                f"under {root}, tests left out, split by file)")
    else:
        raise ValueError(f"--data must be one of {DATA}, got {name!r}")
    digest = hashlib.sha256(b"".join(parts[k] for k in ("train", "valid", "test"))).hexdigest()[:12]
    sizes = " / ".join(f"{len(parts[k]):,}" for k in ("train", "valid", "test"))
    return parts, f"{what}: {sizes} bytes train / validation / test, SHA-256 {digest}"


def windows(raw: bytes, seq_len: int, stride: int) -> np.ndarray:
    """Windows of `seq_len` bytes starting every `stride` bytes: uint8 [n, seq_len] (ValueError if none)."""
    stream = np.frombuffer(raw, np.uint8)
    if stream.size < seq_len:
        raise ValueError(f"{stream.size} bytes hold no window of seq_len={seq_len}")
    return np.ascontiguousarray(np.lib.stride_tricks.sliding_window_view(stream, seq_len)[::stride])


def fixed_batches(win: np.ndarray, num_batches: int, batch_size: int) -> jax.Array:
    """`num_batches` fixed batches of windows spread evenly over `win`: uint8 [num_batches, batch_size, L]."""
    need = num_batches * batch_size
    if win.shape[0] < need:
        raise ValueError(f"a held-out split has {win.shape[0]} windows, < {need}; lower --valid_batches")
    idx = np.linspace(0, win.shape[0] - 1, need).round().astype(np.int64)
    return jnp.asarray(win[idx].reshape(num_batches, batch_size, -1))


def adamw(lr: float, steps: int, *, weight_decay: float = 0.1, warmup: float = 0.05,
          clip: float = 1.0) -> optax.GradientTransformationExtraArgs:
    """AdamW as LMs are trained with it: clip, warm-up + cosine schedule, decoupled weight decay on matrices.

    Args:
      lr: the peak rate (may be traced), reached linearly from 0 in `warmup` × steps (≥ 1) steps, then decayed by a
        cosine to 0.1 × lr at step `steps`.
      steps: the run's length.
      weight_decay: the decoupled weight decay, applied to parameters of rank ≥ 2 only.
      warmup: the warm-up's share of the steps.
      clip: the global gradient norm gradients are clipped to.

    Returns:
      `optax.chain(clip_by_global_norm, adamw(b1 0.9, b2 0.95))`, accepting (and ignoring) extra args like `loss`.
    """
    w = max(1, int(round(warmup * steps)))
    unit = optax.warmup_cosine_decay_schedule(0.0, 1.0, w, max(steps, w + 1), end_value=0.1)
    mask = lambda params: jax.tree_util.tree_map(lambda p: p.ndim >= 2, params)
    return optax.with_extra_args_support(optax.chain(optax.clip_by_global_norm(clip), optax.adamw(
        lambda count: lr * unit(count), b1=0.9, b2=0.95, weight_decay=weight_decay, mask=mask)))


def flops_per_token(num_params: int, num_layers: int, context: int, d_model: int) -> float:
    """Training FLOPs per token: 6 × params (forward, backward) + 12 × layers × context × d_model (attention)."""
    return 6.0 * num_params + 12.0 * num_layers * context * d_model


class RunResult(NamedTuple):
    """One optimizer run.

    Attributes:
      label: the optimizer ("adamw" or the spec).
      rate: AdamW's peak rate, or None for a learned optimizer.
      valid, test: final validation and test losses (NaN when diverged).
      train: mean train loss over the last 5% of the steps (NaN when diverged).
      ms_per_step: mean ms per step after the first (NaN with fewer than 2 steps run).
      first_step_s: seconds of the first call (compilation included).
      wall_s: seconds of the whole run: init, compile, steps and evaluation.
      diverged_at: the first step whose train loss was non-finite, -1 for a non-finite held-out loss, or None.
    """
    label: str
    rate: Optional[float]
    valid: float
    test: float
    train: float
    ms_per_step: float
    first_step_s: float
    wall_s: float
    diverged_at: Optional[int]


def make_eval(task: ByteTransformerTask):
    """A jitted mean loss over fixed batches: `(params, tokens [n, B, L]) -> scalar`."""
    def mean_loss(params, tokens):
        return jnp.mean(jax.lax.map(lambda t: task.loss(params, None, {"tokens": t}), tokens))
    return jax.jit(mean_loss)


@functools.lru_cache(maxsize=None)
def make_step(task: ByteTransformerTask, make_tx):
    """The jitted train step `(carry, data, key, tx_args) -> (carry, loss)`, carry = (params, opt_state, i) donated.

    One step draws batch i of `data` with `fold_in(key, i)` (every optimizer sees the same batches),
    takes the loss and gradient, and applies `make_tx(tx_args).update(grads, state, params, loss=loss)`.
    `tx_args` is traced and the step cached by (task, make_tx): AdamW's rates share one compiled step.
    On a CPU it compiles with `outer_trainers.default_compiler_options()` (-O1), elsewhere with XLA's defaults.

    Args:
      task: the model.
      make_tx: tx_args -> optax transform (`outer_trainers.evaluation.optimizer_specs.learned_tx`'s first result).

    Returns:
      the jitted step.
    """
    def step(carry, data, key, tx_args):
        params, opt_state, i = carry
        batch = data.batch(jax.random.fold_in(key, i), "train")
        loss, grads = jax.value_and_grad(task.loss)(params, key, batch)
        updates, opt_state = make_tx(tx_args).update(grads, opt_state, params, loss=loss)
        return (optax.apply_updates(params, updates), opt_state, i + 1), loss
    return jax.jit(step, donate_argnums=0, compiler_options=default_compiler_options() or None)


def train_run(task: ByteTransformerTask, make_tx, tx_args, params0, key: jax.Array, steps: int, evaluate,
              held_out: dict, label: str = "", rate: Optional[float] = None) -> RunResult:
    """Trains `params0` (not modified) with `make_step(task, make_tx)` for `steps` steps, measured (see `RunResult`).

    Args:
      task: the model and its train data.
      make_tx: tx_args -> optax transform; the state starts as `make_tx(tx_args).init(params0)`.
      tx_args: the optimizer's arguments (AdamW's peak rate, a theta).
      params0: the initial parameters.
      key: the key of the batches.
      steps: training steps (≥ 1).
      evaluate: `make_eval(task)`.
      held_out: {"valid": tokens, "test": tokens}, fixed batches [n, B, L].
      label: the run's label.
      rate: AdamW's peak rate, if any.

    Returns:
      the RunResult.
    """
    start, step = time.perf_counter(), make_step(task, make_tx)
    params = jax.tree_util.tree_map(jnp.copy, params0)
    carry = (params, make_tx(tx_args).init(params), jnp.zeros((), jnp.int32))
    carry, loss = step(carry, task.data, key, tx_args)
    losses = [jax.block_until_ready(loss)]
    first_step_s = time.perf_counter() - start
    checked, diverged_at, t0 = 0, None, time.perf_counter()
    for i in range(1, steps + 1):
        if i == steps or i % CHECK_EVERY == 0:  # losses[:i] are steps 0..i-1
            bad = np.flatnonzero(~np.isfinite(np.asarray(jax.device_get(losses[checked:]), np.float64)))
            if bad.size:
                diverged_at = checked + int(bad[0])
                break
            checked = i
        if i < steps:
            carry, loss = step(carry, task.data, key, tx_args)
            losses.append(loss)
    jax.block_until_ready(carry)
    ms = 1e3 * (time.perf_counter() - t0) / (len(losses) - 1) if len(losses) > 1 else math.nan
    valid = test = train = math.nan
    if diverged_at is None:
        valid, test = (float(evaluate(carry[0], held_out[s])) for s in ("valid", "test"))
        train = float(np.mean(np.asarray(jax.device_get(losses[-max(1, steps // 20):]))))
        if not (math.isfinite(valid) and math.isfinite(test)):
            diverged_at, valid, test, train = -1, math.nan, math.nan, math.nan
    return RunResult(label, rate, valid, test, train, ms, first_step_s, time.perf_counter() - start, diverged_at)


def best_adamw(results: Sequence[RunResult]) -> Optional[RunResult]:
    """The AdamW run of lowest final validation loss; a diverged rate never wins (None if every one diverged)."""
    finite = [r for r in results if r.label == "adamw" and r.diverged_at is None]
    return min(finite, key=lambda r: r.valid) if finite else None


def render(results: Sequence[RunResult], header: str, steps: int, flops_per_step: float, planned: int) -> str:
    """The Markdown report: `header`, then one table row per run, AdamW's best rate marked.

    Args:
      results: the runs so far.
      header: the lines above the table (machine, model, data, budget).
      steps: the steps per run; flops_per_step: training FLOPs of one step (for the TFLOP/s column).
      planned: the number of runs planned (a report with fewer says it is partial).

    Returns:
      the Markdown text, ending with a newline.
    """
    best = best_adamw(results)
    lines = [header, ""]
    if len(results) < planned:
        lines += [f"**Partial: {len(results)} of {planned} runs finished.**", ""]
    lines += [f"| optimizer | rate | validation loss | test loss | train loss (last {max(1, steps // 20)} steps) "
              "| ms / step | TFLOP/s | first step s | wall s |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        name = r.label + (" (best AdamW)" if r is best else "")
        rate = f"{r.rate:g} (peak)" if r.rate is not None else f"— (told {steps} steps)"
        where = "at the end" if (r.diverged_at or 0) < 0 else f"at step {r.diverged_at}"
        losses = (f"{r.valid:.4f} | {r.test:.4f} | {r.train:.4f}" if r.diverged_at is None
                  else f"diverged {where} | diverged | diverged")
        speed = (f"{r.ms_per_step:.2f} | {flops_per_step / r.ms_per_step / 1e9:.1f}" if math.isfinite(r.ms_per_step)
                 else "— | —")
        lines.append(f"| {name} | {rate} | {losses} | {speed} | {r.first_step_s:.1f} | {r.wall_s:.1f} |")
    grid = sorted(r.rate for r in results if r.label == "adamw" and math.isfinite(r.rate))
    if best is not None and len(grid) > 1 and best.rate in (grid[0], grid[-1]):
        lines += ["", f"AdamW's best rate ({best.rate:g}) is on the edge of its grid: a wider grid may do better."]
    return "\n".join(lines) + "\n"


def _args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="20M")
    ap.add_argument("--steps", type=int, help="training steps per run (default: the size's)")
    ap.add_argument("--batch_size", type=int, help="windows per batch (default: the size's)")
    ap.add_argument("--seq_len", type=int, help="bytes per window (default: the size's)")
    ap.add_argument("--optimizer", action="append", help="adamw, pretrained:NAME, published:NAME or a theta file; "
                    f"repeatable (default: {', '.join(DEFAULT_OPTIMIZERS)})")
    ap.add_argument("--adamw_lrs", default="3e-4,1e-3,3e-3", help="comma-separated peak rates AdamW is tuned over")
    ap.add_argument("--data", choices=DATA, default="python_stdlib")
    ap.add_argument("--valid_batches", type=int, default=16, help="fixed held-out batches of validation and of test")
    ap.add_argument("--seed", type=int, default=0, help="seed of the initial parameters and the batches")
    ap.add_argument("--output", help="a Markdown file for the report (refused if it exists, unless --overwrite)")
    ap.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    ap.add_argument("--dry_run", action="store_true", help="build everything, print the budget, train nothing")
    ap.add_argument("--assumed_tflops", type=float, default=40.0, help="effective TFLOP/s of the time estimate")
    ap.add_argument("--note", default="", help="conditions to record in the report")
    args = ap.parse_args(argv)
    for k in ("steps", "batch_size", "seq_len"):
        setattr(args, k, SIZES[args.size][k] if getattr(args, k) is None else getattr(args, k))
        if getattr(args, k) < (2 if k == "seq_len" else 1):
            ap.error(f"--{k} must be at least {2 if k == 'seq_len' else 1}, got {getattr(args, k)}")
    if args.output and os.path.exists(args.output) and not args.overwrite and not args.dry_run:
        ap.error(f"--output {args.output} exists (an earlier report?); pass --overwrite to replace it, or another path")
    return args


def main(argv: Optional[Sequence[str]] = None) -> dict:
    """Runs the benchmark from the command line (`argv`, default `sys.argv[1:]`; see `--help`), printing the
    report and writing it to `--output` after every run (a run cut short keeps what finished).

    Returns:
      {"params", "tokens", "flops_per_run", "results": [RunResult], "best_adamw": RunResult or None,
      "report": the Markdown text, or None for a dry run}.
    """
    args = _args(argv)
    specs = args.optimizer or list(DEFAULT_OPTIMIZERS)
    lrs = [float(x) for x in args.adamw_lrs.split(",") if x.strip()]
    plan = []  # (label, rate, resolved learned optimizer or None), specs resolved before any training
    for spec, label in zip(specs, optimizer_labels(specs)):
        if spec == "adamw":
            plan += [("adamw", lr, None) for lr in lrs]
        elif spec in ("adam", "muon", "sgdm"):
            raise SystemExit(f"--optimizer {spec}: only adamw is tuned here; the learned ones are told the horizon")
        else:
            try:
                plan.append((label, None, resolve_optimizer(spec, label)))
            except ValueError as e:
                raise SystemExit(str(e).replace("evaluate: ", "benchmark_lm_scale: ")) from None
    if not plan:
        raise SystemExit("benchmark_lm_scale: nothing to run (--optimizer adamw with an empty --adamw_lrs)")
    parts, data_what = corpus(args.data)
    train_win = windows(parts["train"], args.seq_len, max(1, args.seq_len // 4))  # starts every seq_len / 4 bytes
    held_out = {s: fixed_batches(windows(parts[s], args.seq_len, args.seq_len), args.valid_batches, args.batch_size)
                for s in ("valid", "test")}
    size = SIZES[args.size]
    data = DataSource(splits={"train": {"tokens": jnp.asarray(train_win)}}, batch_size=args.batch_size, name=args.data)
    task = ByteTransformerTask(data, **{k: size[k] for k in ("d_model", "num_heads", "num_layers")})
    init_key, batch_key = jax.random.split(jax.random.key(args.seed))
    n = sum(math.prod(x.shape) for x in jax.tree_util.tree_leaves(jax.eval_shape(task.init, init_key)))
    tokens = args.steps * args.batch_size * args.seq_len
    context = args.seq_len - 1  # the model reads seq_len - 1 bytes and predicts the next of each
    per_step = args.batch_size * context * flops_per_token(n, size["num_layers"], context, size["d_model"])
    flops = per_step * args.steps
    device = jax.devices()[0]
    command = " ".join(["python scripts/benchmark_lm_scale.py", *(sys.argv[1:] if argv is None else argv)])
    header = (f"## Scale: a {f'{n / 1e6:.1f}M' if n >= 1e5 else f'{n:,}'}-parameter byte-level transformer LM\n\n"
              f"`{command}`\n\n"
              f"Device: {device.device_kind} ({device.platform}), jax {jax.__version__}, matmul precision "
              f"{jax.config.jax_default_matmul_precision or 'default'}. Model: ByteTransformerTask, d_model "
              f"{size['d_model']}, {size['num_heads']} heads, {size['num_layers']} layers, context {context}, "
              f"{n:,} parameters. Data: {data_what}. Budget: {args.steps} steps × {args.batch_size} × {args.seq_len} "
              f"= {tokens:,} tokens ({tokens / len(parts['train']):.2f} passes over the train bytes), {flops:.3g} "
              f"FLOPs per run. AdamW: peak rate over {', '.join(f'{x:g}' for x in lrs)}, warm-up 5% + cosine to "
              f"0.1×, b2 0.95, weight decay 0.1 on rank ≥ 2, clip 1; chosen on validation loss; its rates share one "
              f"compiled step (first step s: compilation included). Learned optimizers told the horizon {args.steps}, "
              f"not tuned. Losses in nats per byte; {args.valid_batches} fixed batches each of validation and test. "
              f"{args.note}".rstrip())
    est_s = len(plan) * flops / (args.assumed_tflops * 1e12)
    print(f"params {n:,}; tokens {tokens:,} per run ({args.steps} × {args.batch_size} × {args.seq_len}); "
          f"{flops:.3g} FLOPs per run, {len(plan)} runs; estimated {est_s / 60:.1f} min of training at "
          f"{args.assumed_tflops:g} TFLOP/s effective, compilation not counted", flush=True)
    print(f"data: {data_what}", flush=True)
    out = {"params": n, "tokens": tokens, "flops_per_run": flops, "results": [], "best_adamw": None, "report": None}
    if args.dry_run:
        return out
    params0, evaluate, results = task.init(init_key), make_eval(task), out["results"]
    adamw_tx = functools.partial(adamw, steps=args.steps)  # one function: AdamW's rates share one compiled step
    for label, rate, opt in plan:
        make_tx, tx_args = (adamw_tx, rate) if opt is None else learned_tx(opt, args.steps)
        r = train_run(task, make_tx, tx_args, params0, batch_key, args.steps, evaluate, held_out, label, rate)
        results.append(r)
        losses = (f"validation {r.valid:.4f}, test {r.test:.4f}, train {r.train:.4f}" if r.diverged_at is None
                  else f"DIVERGED (at step {r.diverged_at}; -1: in held-out loss at the end)")
        print(f"{label}{f' lr={rate:g}' if rate is not None else ''}: {losses}, {r.ms_per_step:.2f} ms/step, "
              f"first step {r.first_step_s:.1f} s, {r.wall_s:.1f} s", flush=True)
        report = render(results, header, args.steps, per_step, len(plan))
        if args.output:
            atomic_write_bytes(args.output, report.encode())
    out["best_adamw"], out["report"] = best_adamw(results), report
    print(report)
    return out


if __name__ == "__main__":
    main()

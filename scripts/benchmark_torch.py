"""Time one step of the shipped optimizer exported to PyTorch (lopt.torch) against torch.optim.Adam.

    python scripts/benchmark_torch.py                          # 1M and 10M parameters, a markdown table
    python scripts/benchmark_torch.py --sizes 1M --repeats 30 --threads 1
    python scripts/benchmark_torch.py --widths 64,32,10 --repeats 3   # any MLP

The model is an MLP of torch nn.Linear layers (the widths of scripts/benchmark_optimizers.py:
~1.0M and ~9.5M float32 parameters) with fixed random gradients. For each size every optimizer
is built, warmed up, then `optimizer.step()` alone is timed `--repeats` times, the optimizers
interleaved round-robin so that a noisy neighbour slows them all alike; the table reports the
medians, their ratio to Adam's, and the bytes of optimizer state per parameter. The optimizers:
torch.optim.Adam (lr 1e-3; torch's default implementation, `foreach` on CPU), the same with
`fused=True` where torch supports it on the device, and `lopt.torch.optimizer(name,
num_steps=1000)` for the shipped "normmlp_v3" and "celo2_v4" (given the loss, as a closure would). `--device cuda` times on a GPU
(synchronised around each step).
"""
from __future__ import annotations

import argparse
import platform
import statistics
import time
from typing import Callable, Optional, Sequence

import torch

import lopt.torch

# layer widths, input first: ~1.0M and ~9.5M parameters (as scripts/benchmark_optimizers.py)
MODELS = {"1M": (784, 1024, 192, 10), "10M": (3072, 2048, 1536, 10)}
SHIPPED = ("normmlp_v3", "celo2_v4")  # lopt.pretrained names timed through lopt.torch


def model_params(widths: Sequence[int], device: str = "cpu", seed: int = 0) -> list[torch.nn.Parameter]:
    """The parameters of an MLP of nn.Linear layers, each with a fixed random gradient.

    Args:
      widths: layer widths, input first.
      device: where they live.
      seed: the seed of the weights and gradients.

    Returns:
      The weights [out, in] and biases [out] of every layer.
    """
    gen = torch.Generator().manual_seed(seed)
    params = []
    for a, b in zip(widths[:-1], widths[1:]):
        for shape in ((b, a), (b,)):
            p = torch.nn.Parameter((torch.randn(shape, generator=gen) / a ** 0.5).to(device))
            p.grad = (torch.randn(shape, generator=gen) * 1e-2).to(device)
            params.append(p)
    return params


def optimizers(device: str) -> dict[str, Callable[[list], torch.optim.Optimizer]]:
    """The benchmarked optimizers by name: factories params -> optimizer."""
    out = {"torch.optim.Adam": lambda ps: torch.optim.Adam(ps, lr=1e-3)}
    try:
        torch.optim.Adam([torch.nn.Parameter(torch.zeros(1, device=device))], lr=1e-3, fused=True)
        out["torch.optim.Adam(fused=True)"] = lambda ps: torch.optim.Adam(ps, lr=1e-3, fused=True)
    except (RuntimeError, TypeError, ValueError):
        pass
    for name in SHIPPED:
        out[f"lopt.torch {name}"] = lambda ps, name=name: lopt.torch.optimizer(name, ps, num_steps=1000)
    return out


def state_bytes_per_param(opt: torch.optim.Optimizer, params: Sequence[torch.Tensor]) -> float:
    """Bytes of the optimizer's state tensors per parameter."""
    n = sum(p.numel() for p in params)
    total = sum(v.numel() * v.element_size() for st in opt.state.values() for v in st.values()
                if isinstance(v, torch.Tensor))
    return total / n


def bench_size(widths: Sequence[int], repeats: int = 20, warmup: int = 3, device: str = "cpu",
               names: Optional[Sequence[str]] = None) -> tuple[int, dict[str, tuple[float, float]]]:
    """Median step time of each optimizer on one model, interleaved.

    Args:
      widths: the MLP's layer widths.
      repeats: timed steps per optimizer (interleaved round-robin).
      warmup: untimed steps per optimizer first.
      device: "cpu" or "cuda".
      names: the optimizers to time (default: all of `optimizers`).

    Returns:
      (the number of parameters, {name: (median seconds per step, state bytes per parameter)}).
    """
    makers = optimizers(device)
    names = list(makers) if names is None else list(names)
    runs = {}
    for name in names:
        params = model_params(widths, device)
        runs[name] = (params, makers[name](params))
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def one(opt):
        sync()
        t0 = time.perf_counter()
        opt.step(loss=1.0) if isinstance(opt, lopt.torch.TorchLearnedOptimizer) else opt.step()
        sync()
        return time.perf_counter() - t0

    for name in names:
        for _ in range(warmup):
            one(runs[name][1])
    times = {name: [] for name in names}
    for _ in range(repeats):
        for name in names:
            times[name].append(one(runs[name][1]))
    n = sum(p.numel() for p in runs[names[0]][0])
    return n, {name: (statistics.median(times[name]), state_bytes_per_param(runs[name][1], runs[name][0]))
               for name in names}


def markdown_table(results: dict[str, tuple[int, dict[str, tuple[float, float]]]]) -> str:
    """The results of `bench_size` per model label as a markdown table (ratios to the first optimizer)."""
    lines = ["| model | parameters | optimizer | median step (ms) | / Adam | state bytes / param |",
             "|---|---:|---|---:|---:|---:|"]
    for label, (n, res) in results.items():
        base = next(iter(res.values()))[0]
        for name, (s, state) in res.items():
            lines.append(f"| {label} | {n:,} | {name} | {s * 1e3:.2f} | {s / base:.2f}x | {state:.1f} |")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> str:
    """Runs the benchmark and prints (and returns) the markdown table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--widths", default=None, help="comma-separated widths of one custom MLP (instead of --sizes)")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    models = {"custom": tuple(int(w) for w in args.widths.split(","))} if args.widths else \
        {s: MODELS[s] for s in args.sizes}
    results = {label: bench_size(w, args.repeats, args.warmup, args.device) for label, w in models.items()}
    where = torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor() or "cpu"
    table = (f"torch {torch.__version__}, {args.device} ({where}), {torch.get_num_threads()} threads, "
             f"median of {args.repeats} interleaved steps\n\n" + markdown_table(results))
    print(table)
    return table


if __name__ == "__main__":
    main()

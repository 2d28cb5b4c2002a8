"""Time one step of the shipped optimizers exported to PyTorch (lopt.torch) against torch's AdamW and Muon.

    python scripts/benchmark_torch.py                          # 1M and 10M MLPs and the tiny GPT-2, a markdown table
    python scripts/benchmark_torch.py --sizes 1M gpt2 --repeats 30 --threads 1
    python scripts/benchmark_torch.py --widths 64,32,10 --repeats 3   # any MLP
    python scripts/benchmark_torch.py --sizes 1M --optimizers torch.optim.AdamW "lopt.torch normmlp_v3"

The models: MLPs of torch nn.Linear layers (the widths of scripts/benchmark_optimizers.py: ~1.0M
and ~9.5M float32 parameters) and "gpt2", a GPT-2 built from a config (2 layers, width 128, byte
vocabulary: ~0.44M parameters; needs transformers), each with fixed random gradients. For each
model every optimizer is built, warmed up, then `optimizer.step()` alone is timed `--repeats`
times, the optimizers interleaved round-robin so that a noisy neighbour slows them all alike; the
table reports the medians, their ratios to AdamW's (foreach) and to Muon + AdamW's, and the bytes
of optimizer state per parameter. The optimizers: torch.optim.AdamW (lr 1e-3; torch's default
implementation, `foreach` on CPU), the same with `fused=True` where torch supports it on the
device, "Muon + AdamW" (torch.optim.Muon on the 2-D weight matrices, AdamW on the rest, where the
installed torch has Muon: the reference of the Celo2 family, which orthogonalizes the same
matrices), and `lopt.torch.optimizer(name, model, num_steps=1000)` for the shipped
`lopt.pretrained.RECOMMENDED` ("celo2_v9"), "normmlp_v3" and "celo2_v5" (its theta without the
deploy rules; roles read from the model's modules; given the loss, as a closure would).
`--device cuda` times on a GPU (synchronised around each step).
"""
from __future__ import annotations

import argparse
import platform
import statistics
import time
from typing import Callable, Optional, Sequence

import torch

import lopt.pretrained
import lopt.torch

# layer widths, input first: ~1.0M and ~9.5M parameters (as scripts/benchmark_optimizers.py)
MODELS = {"1M": (784, 1024, 192, 10), "10M": (3072, 2048, 1536, 10), "gpt2": "gpt2"}
SHIPPED = (lopt.pretrained.RECOMMENDED, "normmlp_v3", "celo2_v5")  # lopt.pretrained names timed through lopt.torch


def build_model(widths, device: str = "cpu", seed: int = 0) -> torch.nn.Module:
    """An MLP of nn.Linear layers (widths, input first) or, for "gpt2", the tiny GPT-2 (2 layers,
    width 128, byte vocabulary), every parameter with a fixed random gradient.

    Args:
      widths: layer widths, input first, or "gpt2".
      device: where it lives.
      seed: the seed of the weights and gradients.

    Returns:
      The module.
    """
    torch.manual_seed(seed)
    if widths == "gpt2":
        import transformers
        config = transformers.GPT2Config(vocab_size=256, n_positions=256, n_embd=128, n_layer=2, n_head=4,
                                         bos_token_id=0, eos_token_id=0)
        model = transformers.GPT2LMHeadModel(config)
    else:
        model = torch.nn.Sequential(*[torch.nn.Linear(a, b) for a, b in zip(widths[:-1], widths[1:])])
    model = model.to(device)
    gen = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.grad = (torch.randn(p.shape, generator=gen) * 1e-2).to(device)
    return model


class MuonAdamW(torch.optim.Optimizer):
    """torch.optim.Muon on the 2-D weight matrices, torch.optim.AdamW on the rest, stepped together."""

    def __init__(self, model: torch.nn.Module, lr: float = 1e-3):
        embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
        params = list(model.parameters())
        matrices = [p for p in params if p.ndim == 2 and id(p) not in embeddings]
        rest = [p for p in params if p.ndim != 2 or id(p) in embeddings]
        self.muon = torch.optim.Muon(matrices, lr=0.02)
        self.adamw = torch.optim.AdamW(rest, lr=lr)
        super().__init__(params, {})

    def step(self, closure=None):
        self.muon.step()
        self.adamw.step()


def optimizers(device: str) -> dict[str, Callable[[torch.nn.Module], torch.optim.Optimizer]]:
    """The benchmarked optimizers by name: factories model -> optimizer (AdamW foreach first)."""
    out = {"torch.optim.AdamW": lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3, foreach=True)}
    try:
        torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1, device=device))], lr=1e-3, fused=True)
        out["torch.optim.AdamW(fused=True)"] = lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3, fused=True)
    except (RuntimeError, TypeError, ValueError):
        pass
    if hasattr(torch.optim, "Muon"):
        out["Muon + AdamW"] = MuonAdamW
    for name in SHIPPED:
        out[f"lopt.torch {name}"] = lambda m, name=name: lopt.torch.optimizer(name, m, num_steps=1000)
    return out


def state_bytes_per_param(opt: torch.optim.Optimizer, params: Sequence[torch.Tensor]) -> float:
    """Bytes of the optimizer's state tensors per parameter."""
    n = sum(p.numel() for p in params)
    states = [opt.muon.state, opt.adamw.state] if isinstance(opt, MuonAdamW) else [opt.state]
    total = sum(v.numel() * v.element_size() for state in states for st in state.values() for v in st.values()
                if isinstance(v, torch.Tensor))
    return total / n


def bench_size(widths: Sequence[int], repeats: int = 20, warmup: int = 3, device: str = "cpu",
               names: Optional[Sequence[str]] = None) -> tuple[int, dict[str, tuple[float, float]]]:
    """Median step time of each optimizer on one model, interleaved.

    Args:
      widths: the MLP's layer widths, or "gpt2".
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
        model = build_model(widths, device)
        runs[name] = (list(model.parameters()), makers[name](model))
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
    """The results of `bench_size` per model label as a markdown table (ratios to the first optimizer,
    AdamW foreach, and to Muon + AdamW where it ran)."""
    lines = ["| model | parameters | optimizer | median step (ms) | / AdamW | / Muon + AdamW | state bytes / param |",
             "|---|---:|---|---:|---:|---:|---:|"]
    for label, (n, res) in results.items():
        base = next(iter(res.values()))[0]
        muon = res.get("Muon + AdamW", (None,))[0]
        for name, (s, state) in res.items():
            vs_muon = f"{s / muon:.2f}x" if muon else "-"
            lines.append(f"| {label} | {n:,} | {name} | {s * 1e3:.2f} | {s / base:.2f}x | {vs_muon} | {state:.1f} |")
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
    ap.add_argument("--optimizers", nargs="+", default=None,
                    help="the optimizers to time, by their table names (default: all; AdamW foreach first for the ratios)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    models = {"custom": tuple(int(w) for w in args.widths.split(","))} if args.widths else \
        {s: MODELS[s] for s in args.sizes}
    results = {label: bench_size(w, args.repeats, args.warmup, args.device, args.optimizers)
               for label, w in models.items()}
    where = torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor() or "cpu"
    table = (f"torch {torch.__version__}, {args.device} ({where}), {torch.get_num_threads()} threads, "
             f"median of {args.repeats} interleaved steps\n\n" + markdown_table(results))
    print(table)
    return table


if __name__ == "__main__":
    main()

"""Meta-trains θ of the influence-balancing toy with PES, NRES, TruncatedES and TruncatedGrad
(K = 1) and plots θ over outer steps to docs/influence_balancing.png.

    python scripts/influence_balancing.py [--particles 1000] [--steps 3000] [--out docs/influence_balancing.png]

Defaults follow the PES paper: σ = 0.1, SGD at 1e-4, θ₀ = 0.5, 3000 outer steps.
"""
from __future__ import annotations

import argparse
import os

import jax
import numpy as np

import outer_trainers as ot
from outer_trainers.examples.influence_balancing import THETA_STAR, InfluenceBalancing, meta_train


def run(particles: int, steps: int, lr: float, std: float, seed: int) -> dict:
    ts = InfluenceBalancing()
    estimators = {
        "TruncatedPES": ot.TruncatedPES(ts, particles, 1, std=std),
        "NoiseReuseES": ot.NoiseReuseES(ts, particles, 1, std=std),
        "TruncatedES": ot.TruncatedES(ts, particles, 1, std=std),
        "TruncatedGrad": ot.TruncatedGrad(ts, 1, 1),
    }
    return {name: meta_train(est, 0.5, steps, lr, jax.random.key(seed)) for name, est in estimators.items()}


def plot(traces: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    for name, th in traces.items():
        ax.plot(np.arange(1, len(th) + 1), th, label=name, lw=1.6)
    ax.axhline(THETA_STAR, color="k", ls="--", lw=1, label="θ* = −1/6")
    ax.set_xlabel("outer step")
    ax.set_ylabel("θ")
    ax.set_title("Influence balancing, truncations of K = 1 step")
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--particles", type=int, default=1000)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--std", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "docs", "influence_balancing.png"))
    a = p.parse_args(argv)
    traces = run(a.particles, a.steps, a.lr, a.std, a.seed)
    for name, th in traces.items():
        print(f"{name:<14} final θ = {th[-1]: .6f}")
    plot(traces, a.out)
    print(f"wrote {os.path.normpath(a.out)}")


if __name__ == "__main__":
    main()

"""Variance (and bias) of each gradient estimator's estimate on a small exact problem.

Problem: LearnableSGDM (θ = {log_lr, logit_momentum}) trains one fixed 2-D quadratic from x = 0;
episodes of `episode_length` steps, truncations of `trunc_length`, so an episode spans many
truncations. Nothing but the estimators' perturbations is random, so the exact per-truncation
gradient comes from jax.jacrev of one unroll and every bit of variance is the estimator's.

For the online estimators (TruncatedES, TruncatedPES, NoiseReuseES, TruncatedGrad) the numbers
are averages over the truncations of one whole episode; FullES and FullGrad estimate the
whole episode's mean loss at once. `variance` is the trace of the covariance of one estimate
(over independent replicates), `bias` the norm of (mean estimate − exact gradient) — only the
biased estimators (TruncatedES, TruncatedGrad) should show a bias well above its noise floor.

The second problem, influence balancing (outer_trainers.examples.influence_balancing) at
θ = 0.5, is one never-ending episode with fading memory: PES's accumulated ξ keeps growing
while only the last ~50 steps' perturbations matter, so its variance grows with the number of
truncations seen and NRES's stays bounded (≈16× lower after 100 truncations of K = 1). On the
quadratic, whose per-truncation influences are all aligned and barely fade within an episode,
the two are comparable (PES slightly lower) — NRES's advantage is a long-episode effect.

    python scripts/estimator_variance.py [--problem all|quadratic|influence] [--replicates 64]
"""
from __future__ import annotations

import argparse
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

import lopt
import outer_trainers as ot
from tasks.base import single_task_family
from tasks.quadratics import QuadraticTask

ONLINE = ("TruncatedES", "TruncatedPES", "NoiseReuseES", "TruncatedGrad")
WHOLE_EPISODE = ("FullES", "FullGrad")
BACKPROP = ("TruncatedGrad", "FullGrad")  # no perturbations, so no std


def make_problem(problem: str, episode_length: int):
    """(TruncatedStep, θ) of `problem`: "quadratic" (episodes with resets) or "influence"
    (influence balancing at θ = 0.5: one never-ending episode, fading memory)."""
    if problem == "influence":
        from outer_trainers.examples.influence_balancing import InfluenceBalancing
        return InfluenceBalancing(), jnp.asarray(0.5, jnp.float32)
    if problem != "quadratic":
        raise ValueError(f"unknown problem {problem!r}; use 'quadratic' or 'influence'")
    task = QuadraticTask(jnp.array([0.5, 2.0]), jnp.array([1.0, -1.0]), init_scale=0.0)
    learned = lopt.LearnableSGDM(0.1, 0.5)
    ts = ot.LOptTruncatedStep(single_task_family(task), learned, ot.ConstantTruncationSchedule(episode_length))
    return ts, learned.init(jax.random.key(0))


def _flat(tree) -> jax.Array:
    return jnp.concatenate([jnp.ravel(x) for x in jax.tree_util.tree_leaves(tree)])


def episode_jacobian(ts, theta, episode_length: int) -> np.ndarray:
    """∂(step-p loss)/∂θ for p = 1..T: [T, dim θ]."""
    def losses(th):
        def body(s, t):
            s, out = ts.step(th, s, jax.random.fold_in(jax.random.key(1), t))
            return s, out.loss
        return jax.lax.scan(body, ts.init(th, jax.random.key(0)), jnp.arange(episode_length))[1]
    return np.stack([np.asarray(x) for x in jax.tree_util.tree_leaves(jax.jacrev(losses)(theta))], axis=-1)


def sample_estimates(est: ot.GradientEstimator, theta, num_estimates: int, replicates: int,
                     key: jax.Array) -> np.ndarray:
    """[replicates, num_estimates, dim θ]: consecutive estimates of independent runs, vmapped in one jit."""
    def run(k):
        state = est.init_state(theta, jax.random.fold_in(k, num_estimates))

        def body(state, t):
            state, e = est.estimate(theta, state, jax.random.fold_in(k, t))
            return state, _flat(e.grad)

        return jax.lax.scan(body, state, jnp.arange(num_estimates))[1]

    return np.asarray(jax.jit(jax.vmap(run))(jax.random.split(key, replicates)))


def make_estimator(name: str, ts, num_tasks: int, trunc_length: int, episode_length: int, std: float):
    """The estimator `name`: whole-episode ones unroll `episode_length` steps, online ones truncations
    of `trunc_length`; the ES ones perturb with σ = `std`."""
    length = episode_length if name in WHOLE_EPISODE else trunc_length
    return getattr(ot, name)(ts, num_tasks, length, **({} if name in BACKPROP else {"std": std}))


def estimator_variances(names: Sequence[str] = ONLINE + WHOLE_EPISODE, *, problem: str = "quadratic",
                        replicates: int = 64,
                        num_tasks: int = 4, episode_length: int = 40, trunc_length: int = 2,
                        std: float = 0.01, seed: int = 0) -> dict:
    """{name: {"variance": ..., "bias": ..., "grad_norm": ...}} (see the module docstring)."""
    ts, theta = make_problem(problem, episode_length)
    jac = episode_jacobian(ts, theta, episode_length)
    num_truncs = episode_length // trunc_length
    steps = np.arange(num_truncs * trunc_length).reshape(num_truncs, trunc_length) % episode_length
    trunc_ref = jac[steps].mean(1)  # [num_truncs, dim]
    results = {}
    for i, name in enumerate(names):
        est = make_estimator(name, ts, num_tasks, trunc_length, episode_length, std)
        online = name not in WHOLE_EPISODE
        ref = trunc_ref if online else jac.mean(0, keepdims=True)
        samples = sample_estimates(est, theta, len(ref), replicates, jax.random.key(seed * 1000 + i))
        variance = samples.var(0, ddof=1).sum(-1).mean()
        bias = np.sqrt(np.mean(np.sum((samples.mean(0) - ref) ** 2, -1)))
        results[name] = {"variance": float(variance), "bias": float(bias),
                         "grad_norm": float(np.sqrt(np.mean(np.sum(ref**2, -1))))}
    return results


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--problem", choices=("all", "quadratic", "influence"), default="all")
    p.add_argument("--replicates", type=int, default=64)
    p.add_argument("--num_tasks", type=int, default=4)
    p.add_argument("--episode_length", type=int, default=None, help="default: 40 (quadratic), 100 (influence)")
    p.add_argument("--trunc_length", type=int, default=None, help="default: 2 (quadratic), 1 (influence)")
    p.add_argument("--std", type=float, default=None, help="default: 0.01 (quadratic), 0.1 (influence)")
    a = p.parse_args(argv)
    defaults = {"quadratic": (40, 2, 0.01), "influence": (100, 1, 0.1)}
    for problem in (("quadratic", "influence") if a.problem == "all" else (a.problem,)):
        T, K, std = [d if v is None else v for v, d in zip((a.episode_length, a.trunc_length, a.std),
                                                          defaults[problem])]
        res = estimator_variances(problem=problem, replicates=a.replicates, num_tasks=a.num_tasks,
                                  episode_length=T, trunc_length=K, std=std)
        print(f"{problem}: episode {T} steps, truncations of {K}, σ = {std}, {a.num_tasks} particle(s), "
              f"{a.replicates} replicates")
        print(f"{'estimator':<15} {'variance':>12} {'bias':>10} {'|exact grad|':>13}")
        for name, r in res.items():
            print(f"{name:<15} {r['variance']:12.4g} {r['bias']:10.3g} {r['grad_norm']:13.3g}")
        print()


if __name__ == "__main__":
    main()

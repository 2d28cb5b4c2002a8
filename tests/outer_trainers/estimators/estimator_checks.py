"""Shared fixtures for the estimator tests: a deterministic unrolled problem with an exact
per-step Jacobian, a NaN-producing task family, the statistical comparison, and the checks of
the estimator contract (test_estimator_contract.py).

Problem: LearnableSGDM (θ = {log_lr, logit_momentum}) trains one fixed 2-D quadratic from
x = 0 in episodes of T = 7 steps; nothing is random, so step p of every episode has the same
loss f_p(θ) and E[ĝ_k] of an unbiased online estimator at truncation k is
mean_{s in truncation k} ∇f_{p(s)}(θ), p(s) = ((s − 1) mod T) + 1.
"""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np

import lopt
import outer_trainers as ot
from outer_trainers.runs import checkpoint_files
from tasks.base import Task, TaskFamily, single_task_family
from tasks.quadratics import QuadraticTask
from tests.fixtures import lopt_step

EPISODE = 7
TRUNC = 3
NUM_TRUNCS = 7  # 21 steps: resets after steps 7, 14, 21 = positions 1, 2, 3 of a truncation


def quadratic_step(episode=EPISODE) -> ot.LOptTruncatedStep:
    """LearnableSGDM(0.1, 0.5) on the fixed 2-D quadratic; `episode`: T or a TruncationSchedule."""
    task = QuadraticTask(jnp.array([0.5, 2.0]), jnp.array([1.0, -1.0]), init_scale=0.0)
    return lopt_step(single_task_family(task), lopt.LearnableSGDM(0.1, 0.5), episode)


def theta0() -> dict:
    return lopt.LearnableSGDM(0.1, 0.5).init(jax.random.key(0))


def flat(tree) -> np.ndarray:
    return np.concatenate([np.ravel(np.asarray(x)) for x in jax.tree_util.tree_leaves(tree)])


def episode_jacobian(ts, theta, episode: int = EPISODE) -> np.ndarray:
    """d f_p / dθ for p = 1..T, shape [T, dim θ] (flattened in tree order)."""
    def losses(th):
        s = ts.init(th, jax.random.key(0))
        def body(s, t):
            s, out = ts.step(th, s, jax.random.fold_in(jax.random.key(1), t))
            return s, out.loss
        return jax.lax.scan(body, s, jnp.arange(episode))[1]
    jac = jax.jacrev(losses)(theta)
    return np.stack([np.asarray(x) for x in jax.tree_util.tree_leaves(jac)], axis=-1)


def truncation_references(jac: np.ndarray, trunc: int, num_truncs: int) -> np.ndarray:
    """Exact E[ĝ_k] of an unbiased online estimator, shape [num_truncs, dim θ]."""
    T = jac.shape[0]
    refs = []
    for k in range(num_truncs):
        steps = np.arange(k * trunc + 1, (k + 1) * trunc + 1)
        refs.append(jac[(steps - 1) % T].mean(0))
    return np.stack(refs)


def collect(est, theta, num_truncs: int, replicates: int, seed: int = 0) -> np.ndarray:
    """Estimates of `replicates` independent runs, shape [replicates, num_truncs, dim θ]."""
    out = np.zeros((replicates, num_truncs, flat(theta).size))
    for r in range(replicates):
        key = jax.random.key(seed * 100003 + r)
        state = est.init_state(theta, jax.random.fold_in(key, 10**6))
        for k in range(num_truncs):
            state, e = est.estimate(theta, state, jax.random.fold_in(key, k))
            out[r, k] = flat(e.grad)
    return out


# The statistical check's design: an unbiased estimator fails it with probability ≤ ALPHA, and a bias of
# REL_BIAS × (the largest |exact gradient| of its truncation) in any element is caught with probability ≥ POWER.
ALPHA, REL_BIAS, POWER = 1e-3, 0.25, 0.99
PILOT, MAX_REPLICATES = 8, 400


def sample_size(pilot: np.ndarray, ref: np.ndarray, *, alpha: float = ALPHA, rel_bias: float = REL_BIAS,
                power: float = POWER) -> tuple[int, float]:
    """The replicates a mean test needs, and its threshold, computed from a pilot's spread.

    The test passes when every element's |mean − ref| / SE < z*. With K elements (truncations × |θ|),
    z* = Φ⁻¹(1 − α / (2K)) (Bonferroni): an unbiased estimator fails with probability ≤ α. A bias b in an
    element of per-replicate standard deviation σ moves its z-score by √n · b / σ, so it is caught with
    probability ≥ `power` once

        n ≥ ((z* + Φ⁻¹(power)) · σ / b)²,     b = rel_bias · max |ref| over that truncation's elements,

    taken over every element (σ from the pilot, ddof 1; the normal approximation of the t statistic).

    Args:
      pilot: [replicates, num_truncs, |θ|] estimates of a pilot run (≥ 2 replicates).
      ref: [num_truncs, |θ|] the exact gradients the mean should equal.
      alpha: the false-alarm probability of the whole test.
      rel_bias: the smallest relative bias the test must detect.
      power: the probability of detecting it.

    Returns:
      (n, z*): the number of replicates (≥ the pilot's) and the z threshold.
    """
    from statistics import NormalDist
    z_star = NormalDist().inv_cdf(1 - alpha / (2 * ref.size))
    z_power = NormalDist().inv_cdf(power)
    sigma = pilot.std(0, ddof=1)
    bias = rel_bias * np.abs(ref).max(axis=-1, keepdims=True)
    n = int(np.ceil(np.max(((z_star + z_power) * sigma / np.maximum(bias, 1e-30)) ** 2)))
    return max(n, pilot.shape[0]), z_star


def collect_for_test(est, theta, ref: np.ndarray, first_only: bool = False) -> tuple[np.ndarray, float]:
    """Estimates of as many replicates as `sample_size` says the mean test needs, and its threshold.

    A pilot of PILOT replicates sets the size; the rest are drawn with other keys and joined to it.

    Args:
      est: the estimator.
      theta: meta-parameters.
      ref: [num_truncs, |θ|] exact gradients of the truncations collected.
      first_only: size the test on the first truncation alone (estimators unbiased only there).

    Returns:
      (samples [n, num_truncs, |θ|], z*).
    """
    pilot = collect(est, theta, len(ref), PILOT, seed=0)
    n, z_star = sample_size(pilot[:, :1] if first_only else pilot, ref[:1] if first_only else ref)
    assert n <= MAX_REPLICATES, (f"{est!r}: the mean test needs {n} replicates (> {MAX_REPLICATES}) to see a "
                                 f"{REL_BIAS:.0%} bias: the estimator's spread is too large for this check")
    if n == PILOT:
        return pilot, z_star
    return np.concatenate([pilot, collect(est, theta, len(ref), n - PILOT, seed=1)]), z_star


def z_scores(samples: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """(mean − ref) / standard error, elementwise over [num_truncs, dim θ]."""
    mean = samples.mean(0)
    se = samples.std(0, ddof=1) / np.sqrt(samples.shape[0])
    return (mean - ref) / np.maximum(se, 1e-12)


def assert_unbiased(samples: np.ndarray, ref: np.ndarray, max_z: float = 3.0) -> None:
    z = z_scores(samples, ref)
    assert np.all(np.abs(z) < max_z), f"estimate mean off the exact gradient by {np.abs(z).max():.2f} SE\n" \
                                      f"z =\n{np.round(z, 2)}\nmean =\n{samples.mean(0)}\nexact =\n{ref}"


def assert_matches(samples: np.ndarray, ref: np.ndarray, stochastic: bool, max_z: float = 3.0) -> None:
    """An ES estimator's mean is within `max_z` SE of `ref`; a backprop one's every sample equals it."""
    if stochastic:
        assert_unbiased(samples, ref, max_z)
    else:
        np.testing.assert_allclose(samples, np.broadcast_to(ref, samples.shape), rtol=1e-4, atol=1e-7)


def assert_biased_after_first(samples: np.ndarray, ref: np.ndarray, stochastic: bool) -> None:
    """Truncations after the first are far off `ref`: some mean > 10 SE away (ES), or the second
    truncation's estimate off by > 10% of its largest entry (backprop)."""
    if stochastic:
        z = z_scores(samples, ref)
        assert np.abs(z[1:]).max() > 10, np.round(z, 2)
    else:
        assert np.abs(samples[:, 1] - ref[1]).max() > 0.1 * np.abs(ref[1]).max(), (samples[:, 1], ref[1])


class NaNQuadraticFamily(TaskFamily):
    """2-D quadratics; with probability `p_bad` a sampled task's loss (and gradient) is NaN."""

    def __init__(self, p_bad: float = 0.3):
        self.p_bad = p_bad
        self.name = "nan_quadratic"
        self.data = None

    def sample(self, key):
        return {"bad": jax.random.uniform(key) < self.p_bad}

    def task_fn(self, cfg):
        return _NaNQuadratic(cfg["bad"])


class _NaNQuadratic(Task):
    def __init__(self, bad):
        self.bad = bad

    def init(self, key):
        return {"x": jax.random.normal(key, (2,))}

    def loss(self, params, key, batch):
        return 0.5 * jnp.sum(jnp.square(params["x"] - 1.0)) * jnp.where(self.bad, jnp.nan, 1.0)


def nan_step(episode: int = 6, p_bad: float = 0.3) -> ot.LOptTruncatedStep:
    """LearnableSGDM(0.1, 0.5) on `NaNQuadraticFamily(p_bad)` in episodes of `episode` steps."""
    return lopt_step(NaNQuadraticFamily(p_bad), lopt.LearnableSGDM(0.1, 0.5), episode)


def assert_nonfinite_handled(est, theta, num_estimates: int = 3) -> None:
    """Particles hitting NaN losses are counted and reset; every estimate stays finite and reports
    that some but not all of its inner steps counted."""
    state = est.init_state(theta, jax.random.key(0))
    total = 0
    for i in range(num_estimates):
        state, e = est.estimate(theta, state, jax.random.key(i + 1))
        assert np.all(np.isfinite(flat(e.grad))), e.grad
        assert np.isfinite(float(e.loss))
        assert 0 < int(e.num_valid) <= int(e.num_steps), (e.num_valid, e.num_steps)
        total += int(e.metrics["nonfinite"])
        assert int(e.metrics["resets"]) >= 1
    assert total > 0


def diverged_theta(theta: dict) -> dict:
    """θ of LearnableSGDM thrown far by the outer optimizer: lr = exp(1000) = inf, so every inner
    update is non-finite (the same shapes as θ, so an estimator does not recompile for it)."""
    return dict(theta, log_lr=theta["log_lr"] + 1000.0)


def assert_all_masked_estimate_is_empty(est, theta, num_estimates: int = 2) -> None:
    """When every inner step is non-finite the estimate says so: 0 valid of > 0 steps, a NaN loss
    (no meta-loss, not 0) and a finite gradient, so the learner drops it rather than apply it."""
    state = est.init_state(theta, jax.random.key(0))
    for i in range(num_estimates):
        state, e = est.estimate(theta, state, jax.random.key(i + 1))
        assert int(e.num_valid) == 0 and int(e.num_steps) > 0, (e.num_valid, e.num_steps)
        assert np.isnan(float(e.loss)) and np.all(np.isfinite(flat(e.grad)))


def assert_counts_every_step(est, theta) -> None:
    """On a problem without non-finite steps every inner step of an estimate counts."""
    state = est.init_state(theta, jax.random.key(0))
    _, e = est.estimate(theta, state, jax.random.key(1))
    assert int(e.num_valid) == int(e.num_steps) == est.inner_steps_per_estimate, (e.num_valid, e.num_steps)


def assert_checkpoint_round_trip(est, theta, path) -> None:
    """The state after one estimate, written with `checkpoint_files.to_bytes` and read back with
    `checkpoint_files.restore`, gives the same next estimate (and state) bit for bit."""
    state = est.init_state(theta, jax.random.key(0))
    state, _ = est.estimate(theta, state, jax.random.key(1))
    with open(path, "wb") as f:
        f.write(checkpoint_files.to_bytes(state, step=1))
    restored, payload = checkpoint_files.restore(str(path), state)
    assert payload["step"] == 1
    chex.assert_trees_all_equal(jax.device_get(restored), jax.device_get(state))
    chex.assert_trees_all_equal(est.estimate(theta, restored, jax.random.key(2)),
                                est.estimate(theta, state, jax.random.key(2)))


def assert_no_recompile(est, theta, compile_counter) -> None:
    """The second estimate compiles nothing, its theta updated as a learner updates it: by a jitted function of
    the first estimate's gradient (so it lives where that gradient lives, e.g. on the estimator's mesh, where the
    first theta came fresh from the host)."""
    state = est.init_state(theta, jax.random.key(0))
    state, e = est.estimate(theta, state, jax.random.key(1))
    update = jax.jit(lambda t, g: jax.tree_util.tree_map(lambda a, b: a - 0.01 * b, t, g))
    theta = update(theta, e.grad)
    jax.block_until_ready((theta, e))
    with compile_counter() as c:
        state, e = est.estimate(theta, state, jax.random.key(2))
        jax.block_until_ready(e)
    assert c.count == 0, f"{est!r} recompiled {c.count} time(s) on its second estimate"

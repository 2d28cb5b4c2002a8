"""The held-out meta-gradient of each meta-training estimator against the exact one, on a case that over-fits.

Problem: tests/outer_trainers/heldout_case.py (200 noisily labelled digits, a 64-wide tanh MLP, LearnableAdamW
θ = {log_lr, weight_decay} at lr 2e-2, λ = 0, episodes of T = 160 steps, the meta-loss the normalised loss on
an "outer_valid" batch after each step, averaged over the episode). Reference: `jax.grad` of the episode's
mean meta-loss through all T steps, averaged over M fresh episodes.

Each estimator's estimate of that gradient, from fresh particles (no stagger):
- TruncatedPES, NoiseReuseES: truncations of K = 80; Σ_k ĝ_k · K / T over the episode's 2 truncations
  (unbiased online estimators: each ĝ_k is the gradient of the mean meta-loss of its K steps);
- TruncatedES, TruncatedGrad: one truncation of K = T (they ignore θ's effect on the state carried
  into a truncation, which a whole-episode truncation does not have).

Check, per component j of θ, over R independent replicates of N pairs (particles):
    |mean_est − mean_ref| < 3.5 · √(SE_est² + SE_ref²)       (the estimate is within its confidence bound)
    sign(mean_est) = sign(mean_ref), |mean_est| > 3 · SE_est  (the sign is resolved, and right)
and the reference itself is resolved (|mean_ref| > 3 SE_ref), so that the sign check can fail.

Sample sizes from that bound: the sign check needs SE_est = s / √(R·N) below |g_j| / 3, with margin:
|g_j| / SE_est ≈ 4.5 for ~90 % power, so R·N ≥ (4.5 s / |g_j|)². Measured: exact g ≈ (+0.025, −0.028) for
(log_lr, λ), spread per episode (0.020, 0.025) → M = 16 resolves both at ≥ 4 SE. Spread of one pair's estimate
of ∂/∂λ (the less resolved component): PES s ≈ 0.09 (two truncations of 80; ≈ 0.10 with four of 40, where
R·N = 64 left the sign at 2.3 SE) → R·N ≥ 210: R = 32, N = 8; NoiseReuseES s ≈ 0.12 → R·N ≥ 370: R = 48;
TruncatedES s ≈ 0.046 → R·N ≥ 110 … 64 measured |g| / SE = 4.9: R = 8; TruncatedGrad (exact per particle,
s = 0.025) → 32 particles, |g| / SE ≈ 6.
"""
from __future__ import annotations

import jax
import numpy as np
import pytest

import outer_trainers as ot
from tests.outer_trainers import heldout_case as H

K = 80  # truncation of the online estimators: 2 per episode
M = 16  # exact episodes of the reference
Z_BOUND, Z_SIGN = 3.5, 3.0
STD = 0.1  # σ of the ES estimators: the loss is smooth at that scale (FD at h = 0.1 matches jax.grad)

ESTIMATORS = {  # name -> (make(ts), trunc_length, replicates R); N = 8 pairs (4 particles for TruncatedGrad)
    "TruncatedPES": (lambda ts: ot.TruncatedPES(ts, 8, K, std=STD), K, 32),
    "NoiseReuseES": (lambda ts: ot.NoiseReuseES(ts, 8, K, std=STD), K, 48),
    "TruncatedES": (lambda ts: ot.TruncatedES(ts, 8, H.T, std=STD), H.T, 8),
    "TruncatedGrad": (lambda ts: ot.TruncatedGrad(ts, 4, H.T), H.T, 8),
}


def episode_estimates(est, theta, trunc: int, replicates: int, seed: int = 0) -> np.ndarray:
    """Σ_k ĝ_k · K / T over one episode of fresh particles, for each replicate: [replicates, |θ|]."""
    out = []
    for r in range(replicates):
        key = jax.random.key(seed * 1009 + r)
        state = est.init_state(theta, jax.random.fold_in(key, 0))
        total = 0.0
        for k in range(H.T // trunc):
            state, e = est.estimate(theta, state, jax.random.fold_in(key, k + 1))
            total = total + H.flat(e.grad) * trunc / H.T
        out.append(total)
    return np.stack(out)


def mean_se(samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return samples.mean(0), samples.std(0, ddof=1) / np.sqrt(samples.shape[0])


def assert_agrees(samples: np.ndarray, ref: np.ndarray, what: str) -> None:
    """The checks of the module docstring."""
    (m, se), (mr, ser) = mean_se(samples), mean_se(ref)
    report = f"{what}: estimate {m} ± {se}, exact {mr} ± {ser}"
    print(report)
    assert np.all(np.abs(mr) > Z_SIGN * ser), "the reference does not resolve the sign: " + report
    assert np.all(np.abs(m - mr) < Z_BOUND * np.sqrt(se**2 + ser**2)), "outside the confidence bound: " + report
    assert np.all(np.sign(m) == np.sign(mr)) and np.all(np.abs(m) > Z_SIGN * se), "sign not resolved/right: " + report


@pytest.fixture(scope="module")
def heldout():
    """(truncated step, θ, exact per-episode gradients [M, 2 meta-losses, |θ|]: held-out, train)."""
    ts = H.truncated_step("outer_valid")
    theta = H.learned_opt().init(jax.random.key(0))
    return ts, theta, H.episode_gradients(ts, theta, jax.random.key(7), M)


@pytest.mark.slow
def test_heldout_and_train_meta_losses_pull_the_decay_apart(heldout):
    """The known answer, from exact gradients: held-out loss wants λ up, training loss wants it down."""
    _, _, ref = heldout
    (mv, sev), (mt, set_) = mean_se(ref[:, 0]), mean_se(ref[:, 1])
    assert mv[1] < -Z_SIGN * sev[1], (mv, sev)  # ∂/∂λ of the held-out loss < 0: decay helps
    assert mt[1] > Z_SIGN * set_[1], (mt, set_)  # ∂/∂λ of the training loss > 0: decay hurts


@pytest.mark.slow
@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_heldout_meta_gradient_matches_exact(name, heldout):
    ts, theta, ref = heldout
    make, trunc, replicates = ESTIMATORS[name]
    assert_agrees(episode_estimates(make(ts), theta, trunc, replicates), ref[:, 0], name)

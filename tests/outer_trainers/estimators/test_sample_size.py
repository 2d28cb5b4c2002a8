"""estimator_checks.sample_size: the statistical checks' replicates and threshold, checked by simulation.

Simulated estimators (numpy normal draws with a known spread) stand in for ES estimates: an unbiased one
passes the mean test at the computed size in all but ≈ α of simulated runs, one with a bias of
REL_BIAS × max |ref| in a single element fails in ≥ POWER of them, and a smaller size misses that bias
more often."""
from statistics import NormalDist

import numpy as np

from tests.outer_trainers.estimators import estimator_checks as C

REF = np.array([[1.0, -0.5], [0.8, 0.2], [-0.3, 0.6]])  # [num_truncs, |θ|]
SIGMA = np.array([[2.0, 1.0], [3.0, 0.5], [1.0, 4.0]])  # per-replicate spread of each element


def _fails(samples, ref, z_star):
    return bool(np.any(np.abs(C.z_scores(samples, ref)) >= z_star))


def test_size_and_threshold_follow_the_formula():
    rng = np.random.default_rng(0)
    pilot = REF + SIGMA * rng.standard_normal((C.PILOT, *REF.shape))
    n, z_star = C.sample_size(pilot, REF, alpha=1e-3, rel_bias=0.25, power=0.99)
    assert z_star == NormalDist().inv_cdf(1 - 1e-3 / (2 * REF.size))
    b = 0.25 * np.abs(REF).max(-1, keepdims=True)
    want = np.ceil((((z_star + NormalDist().inv_cdf(0.99)) * pilot.std(0, ddof=1) / b) ** 2).max())
    assert n == want and n > C.PILOT
    # a pilot that already suffices is the sample: never fewer replicates than the pilot
    assert C.sample_size(REF + 1e-6 * rng.standard_normal((C.PILOT, *REF.shape)), REF)[0] == C.PILOT


def test_unbiased_passes_and_a_quarter_bias_is_caught_at_the_computed_size():
    rng = np.random.default_rng(1)
    n, z_star = C.sample_size(REF + SIGMA * rng.standard_normal((400, *REF.shape)), REF)  # σ known well
    runs = 300
    worst = np.unravel_index(np.argmax(SIGMA / np.abs(REF).max(-1, keepdims=True)), REF.shape)  # hardest element
    bias = np.zeros_like(REF)
    bias[worst] = C.REL_BIAS * np.abs(REF[worst[0]]).max()
    false_alarms = sum(_fails(REF + SIGMA * rng.standard_normal((n, *REF.shape)), REF, z_star) for _ in range(runs))
    caught = sum(_fails(REF + bias + SIGMA * rng.standard_normal((n, *REF.shape)), REF, z_star) for _ in range(runs))
    caught_small = sum(_fails(REF + bias + SIGMA * rng.standard_normal((n // 4, *REF.shape)), REF, z_star)
                       for _ in range(runs))
    assert false_alarms <= 3, false_alarms  # α = 1e-3: expected 0.3 of 300 (t tails at n ≈ 100: a little more)
    assert caught >= 0.97 * runs, caught  # power 0.99
    assert caught_small < 0.8 * runs, caught_small  # a quarter of the size is not enough: the size matters

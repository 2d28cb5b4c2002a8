"""TruncatedPES: random_initial_iteration_offset staggers the pairs' episodes and the estimate stays
unbiased; a truncation's counts are named sums (the rest: test_estimator_contract, and PES on
influence balancing: test_influence_balancing)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import outer_trainers as ot
from outer_trainers.estimators.truncated_pes import PESStats, stats_to_estimate
from tests.outer_trainers.estimators import estimator_checks as C

EPISODE, TRUNC, PAIRS = 12, 2, 64


def staggered_references(jac: np.ndarray, trunc: int, num_truncs: int) -> np.ndarray:
    """Exact E[ĝ_k] [num_truncs, |θ|] when each pair starts o ~ U{0, ..., T − 1} steps into its first
    T-step episode: its step s is step s of the shortened first episode if s <= T − o, else step
    ((s − (T − o) − 1) mod T) + 1 of a later one."""
    T = jac.shape[0]
    refs = []
    for k in range(num_truncs):
        steps = np.arange(k * trunc + 1, (k + 1) * trunc + 1)
        pos = np.asarray([[s if s <= T - o else (s - (T - o) - 1) % T + 1 for s in steps] for o in range(T)])
        refs.append(jac[pos - 1].mean((0, 1)))
    return np.stack(refs)


@pytest.fixture(scope="module")
def staggered():
    ts = C.quadratic_step(episode=EPISODE)
    est = ot.TruncatedPES(ts, PAIRS, TRUNC, std=0.01, random_initial_iteration_offset=EPISODE - 1)
    return ts, C.theta0(), est


def test_random_offset_spreads_resets(staggered):
    _, theta, est = staggered
    state = est.init_state(theta, jax.random.key(0))
    resets = []
    for i in range(EPISODE // TRUNC):
        state, e = est.estimate(theta, state, jax.random.key(i + 1))
        resets.append(int(e.metrics["resets"]))
    # each pair starts 0-11 steps into its 12-step episode: it ends it exactly once in these 12 steps,
    # and the ends are spread over all six truncations instead of coming in one
    assert sum(resets) == PAIRS and min(resets) > 0, resets


@pytest.mark.slow  # a statistical check
def test_staggered_estimate_is_unbiased(staggered):
    """Offsets uniform in [0, T − 1] and shared by both halves of a pair: otherwise the mean estimate
    misses the staggered reference (halves with offsets of their own would end their first episode
    together at the earlier end, skewing the positions)."""
    ts, theta, est = staggered
    ref = staggered_references(C.episode_jacobian(ts, theta, EPISODE), TRUNC, EPISODE // TRUNC)
    samples, max_z = C.collect_for_test(est, theta, ref)  # replicates computed from a pilot's spread
    C.assert_unbiased(samples, ref, max_z)
    unstaggered = C.truncation_references(C.episode_jacobian(ts, theta, EPISODE), TRUNC, EPISODE // TRUNC)
    assert np.abs(C.z_scores(samples, unstaggered)).max() > 10  # the check tells staggered from not


def test_stats_are_named_sums_that_add_up_and_give_the_estimate():
    """Shards add their PESStats field by field (as psum does); the Estimate reads them by name:
    loss = loss_sum / unmasked_steps, num_valid = counted_steps, num_steps = steps."""
    half = PESStats(*(jnp.float32(v) for v in (3.0, 2.0, 1.0, 1.0, 2.0, 4.0)))
    total = jax.tree_util.tree_map(jnp.add, half, half)
    e = stats_to_estimate({"w": jnp.ones(2)}, total)
    assert float(e.loss) == 1.5 and int(e.num_valid) == 4 and int(e.num_steps) == 8
    assert {k: int(v) for k, v in e.metrics.items()} == {"nonfinite": 2, "resets": 2}
    empty = stats_to_estimate({"w": jnp.ones(2)}, PESStats(*(jnp.float32(v) for v in (0, 0, 4, 1, 0, 4))))
    assert np.isnan(float(empty.loss)) and int(empty.num_valid) == 0  # no unmasked step: no meta-loss

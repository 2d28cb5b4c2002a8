"""Truncation schedules: when episodes end, log-uniform lengths, max_length, hashing by value."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import outer_trainers as ot


def test_constant_done_exactly_at_length():
    s = ot.ConstantTruncationSchedule(5)
    st = s.init(jax.random.key(0))
    dones = []
    for step in range(1, 8):
        st2, done = s.next_state(st, jnp.asarray(step), jax.random.key(step))
        dones.append(bool(done))
    assert dones == [False, False, False, False, True, True, True]


def test_log_uniform_range_and_spread():
    s = ot.LogUniformTruncationSchedule(10, 1000)
    lengths = np.asarray(jax.vmap(lambda k: s.init(k).length)(jax.random.split(jax.random.key(0), 4000)))
    assert lengths.min() >= 10 and lengths.max() <= 1000
    # log-uniform: about half the mass below the geometric mean (100)
    assert 0.45 < np.mean(lengths < 100) < 0.55
    chex.assert_type(lengths, np.int32)


def test_log_uniform_redraws_length_when_done():
    s = ot.LogUniformTruncationSchedule(10, 1000)
    st = ot.TruncationState(length=jnp.asarray(10, jnp.int32))
    new, done = s.next_state(st, jnp.asarray(10), jax.random.key(3))
    assert bool(done)
    assert int(new.length) == int(s.init(jax.random.key(3)).length)
    same, done = s.next_state(st, jnp.asarray(9), jax.random.key(3))
    assert not bool(done) and int(same.length) == 10


def test_never_ending_never_done():
    s = ot.NeverEndingTruncationSchedule()
    st = s.init(jax.random.key(0))
    _, done = s.next_state(st, jnp.asarray(10**9), jax.random.key(1))
    assert not bool(done)


@pytest.mark.parametrize("args", [(0,), (-3,)])
def test_bad_constant_length(args):
    with pytest.raises(ValueError, match="length"):
        ot.ConstantTruncationSchedule(*args)


def test_bad_log_uniform_bounds():
    with pytest.raises(ValueError, match="min_length"):
        ot.LogUniformTruncationSchedule(100, 10)


def test_schedules_hash_by_value():
    assert hash(ot.LogUniformTruncationSchedule(1, 2)) == hash(ot.LogUniformTruncationSchedule(1, 2))
    assert ot.ConstantTruncationSchedule(3) == ot.ConstantTruncationSchedule(3)


def test_max_length_is_the_longest_episode():
    assert ot.ConstantTruncationSchedule(5).max_length == 5
    assert ot.LogUniformTruncationSchedule(10, 1000).max_length == 1000
    assert ot.NeverEndingTruncationSchedule().max_length is None
    with pytest.raises(TypeError, match="max_length"):
        ot.LogUniformTruncationSchedule(10)  # still a required argument


def _draws(schedule, n=20000):
    return np.asarray(jax.vmap(lambda k: schedule.init(k).length)(jax.random.split(jax.random.key(0), n)))


@pytest.mark.parametrize("power", [0.0, 1.0, 2.0, 2.5])
def test_power_law_matches_its_density(power):
    a, b = 10, 1000
    lengths = _draws(ot.PowerLawTruncationSchedule(a, b, power))
    chex.assert_type(lengths, np.int32)
    assert lengths.min() >= a and lengths.max() <= b
    # P(L < 100) from the continuous density ∝ L^-power on [a, b + 1) (floor: L < 100 iff x < 100)
    hi = b + 1.0
    if power == 1.0:
        expected = np.log(100 / a) / np.log(hi / a)
    else:
        c = 1.0 - power
        expected = (100.0 ** c - a ** c) / (hi ** c - a ** c)
    assert abs(np.mean(lengths < 100) - expected) < 0.015


def test_power_law_two_gives_equal_inner_steps_per_octave():
    lengths = _draws(ot.PowerLawTruncationSchedule(100, 6399, 2.0), 200000).astype(np.float64)
    octaves = [(100 * 2**i, 100 * 2**(i + 1)) for i in range(6)]
    shares = np.array([lengths[(lengths >= lo) & (lengths < hi)].sum() for lo, hi in octaves]) / lengths.sum()
    chex.assert_trees_all_close(shares, np.full(6, 1 / 6), atol=0.01)


def test_power_law_one_is_log_uniform():
    power_law = _draws(ot.PowerLawTruncationSchedule(10, 1000, 1.0))
    log_uniform = _draws(ot.LogUniformTruncationSchedule(10, 1000))
    for q in (0.1, 0.5, 0.9):
        assert abs(np.quantile(power_law, q) / np.quantile(log_uniform, q) - 1) < 0.05


@pytest.mark.parametrize("args,match", [((100, 10, 2.0), "min_length"), ((10, 100, -1.0), "power"),
                                        ((10, 100, float("nan")), "power")])
def test_bad_power_law(args, match):
    with pytest.raises(ValueError, match=match):
        ot.PowerLawTruncationSchedule(*args)


def test_power_law_hashes_by_value_and_needs_power():
    assert hash(ot.PowerLawTruncationSchedule(1, 9, 2.0)) == hash(ot.PowerLawTruncationSchedule(1, 9, 2.0))
    assert ot.PowerLawTruncationSchedule(1, 9, 2.0).max_length == 9
    with pytest.raises(TypeError, match="power"):
        ot.PowerLawTruncationSchedule(1, 9)

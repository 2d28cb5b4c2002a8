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

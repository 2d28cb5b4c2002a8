"""CheckpointPolicy: which kinds are due at a step (by steps, by time, permanent, final), which metric
value is better, and bad settings refused."""
import numpy as np
import pytest

from outer_trainers.runs.checkpoint_policy import CheckpointPolicy


def test_kinds_due_by_steps_time_permanent_and_final():
    p = CheckpointPolicy(every_steps=4, every_seconds=10.0, checkpoints_at=(3,), permanent_every=5, save_final=True)
    assert p.kinds_due(1) == [] and p.kinds_due(1, seconds_since_save=9.9) == []
    assert p.kinds_due(1, seconds_since_save=10.0) == ["rolling"]
    assert p.kinds_due(3) == ["permanent"] and p.kinds_due(8) == ["rolling"]
    assert p.kinds_due(20) == ["permanent", "rolling"]
    assert p.kinds_due(7, final=True) == ["rolling"]
    assert CheckpointPolicy(save_final=False).kinds_due(7, final=True) == []


def test_better_follows_best_mode_and_never_takes_non_finite_values():
    low, high = CheckpointPolicy(best_mode="min"), CheckpointPolicy(best_mode="max")
    assert low.better(1.0, None) and low.better(0.5, 1.0) and not low.better(1.0, 1.0)
    assert high.better(2.0, 1.0) and not high.better(0.5, 1.0)
    assert not any(low.better(v, None) for v in (None, float("nan"), float("inf"), np.float32("-inf")))


def test_bad_settings_are_refused_and_checkpoints_at_is_a_tuple():
    assert CheckpointPolicy(checkpoints_at=[np.int64(5), 2]).checkpoints_at == (5, 2)
    with pytest.raises(ValueError, match="keep and keep_best must be >= 1"):
        CheckpointPolicy(keep=0)
    with pytest.raises(ValueError, match="best_mode must be 'min' or 'max'"):
        CheckpointPolicy(best_mode="lowest")
    with pytest.raises(ValueError, match="every_steps must be >= 1 or None"):
        CheckpointPolicy(every_steps=0)
    assert hash(CheckpointPolicy(every_steps=2)) == hash(CheckpointPolicy(every_steps=2))

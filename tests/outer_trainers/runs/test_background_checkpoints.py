"""BackgroundCheckpointManager: writes from host copies in a thread, same files and policy as CheckpointManager."""
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from outer_trainers.runs.background_checkpoints import BackgroundCheckpointManager, host_copy
from outer_trainers.runs.checkpoint_files import restore
from outer_trainers.runs.checkpoint_manager import CheckpointManager
from outer_trainers.runs.checkpoint_policy import CheckpointPolicy

POLICY = CheckpointPolicy(every_steps=1, every_seconds=None, keep=2, checkpoints_at=(2,), best_metric="loss")


def _state(x):
    return {"w": jnp.full((3,), x, jnp.float32), "hist": np.full((2,), x, np.float32), "key": jax.random.key(7)}


def test_host_copy_is_detached_from_later_changes():
    state = _state(1.0)
    copy = host_copy(state)
    state["hist"][:] = 5.0
    np.testing.assert_array_equal(copy["hist"], [1.0, 1.0])
    assert isinstance(copy["w"], np.ndarray) and jax.dtypes.issubdtype(copy["key"].dtype, jax.dtypes.prng_key)


def test_same_files_as_the_synchronous_manager_and_what_was_saved_is_written(tmp_path):
    mgr = BackgroundCheckpointManager(str(tmp_path / "bg"), POLICY)
    sync = CheckpointManager(str(tmp_path / "sync"), POLICY)
    for step, value in enumerate([3.0, 2.0, 2.5, 1.0], start=1):
        state = _state(float(step))
        for m in (mgr, sync):
            m.save(step, state, {"step": step}, kinds=m.due(step, 0.0))
            m.save_best(step, state, value)
        assert mgr.last_save_step == step
        state["hist"][:] = -1.0  # changed after save: the queued write keeps the saved values
    mgr.close()
    for kind in ("rolling", "permanent", "best"):
        assert [s for s, _ in mgr.list(kind)] == [s for s, _ in sync.list(kind)], kind
    assert [s for s, _ in mgr.list("rolling")] == [3, 4] and [s for s, _ in mgr.list("best")] == [4]
    restored, payload = restore(mgr.path("rolling", 4), jax.eval_shape(lambda: _state(0.0)))
    np.testing.assert_array_equal(restored["hist"], [4.0, 4.0])
    assert payload["meta"] == {"step": 4}
    assert jax.random.key_data(restored["key"]).tolist() == jax.random.key_data(jax.random.key(7)).tolist()


def test_a_failed_write_is_raised_by_wait(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    mgr = BackgroundCheckpointManager(str(blocker / "ckpts"), POLICY)
    mgr.save(1, _state(1.0))  # returns; the write fails in the thread
    with pytest.raises(OSError):
        mgr.close()
    assert not os.path.exists(blocker / "ckpts")


def test_a_rolling_save_restarts_the_time_clock_at_once(tmp_path):
    mgr = BackgroundCheckpointManager(str(tmp_path), CheckpointPolicy(every_seconds=10.0))
    mgr.mark_time(0.0)
    assert mgr.due(1, 11.0) == ["rolling"]
    mgr.save(1, _state(1.0), kinds=["rolling"], now=11.0)
    assert mgr.due(2, 12.0) == []  # the clock restarted at 11 before the write finished
    mgr.close()

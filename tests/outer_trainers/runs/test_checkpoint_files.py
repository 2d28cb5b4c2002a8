"""One checkpoint file: a state with typed keys round-trips through a file, the checksum is verified
before anything else, and version-1 files are read with a warning."""
import json
import os
import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import outer_trainers as ot
from outer_trainers.runs import checkpoint_files as C

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import resume_job  # noqa: E402


@pytest.fixture(scope="module")
def setup():
    return resume_job.build()


def test_state_roundtrip_with_typed_keys(setup, tmp_path):
    learner, ests = setup
    state = ot.init_outer_state(learner, ests, jax.random.key(0))
    mgr = ot.CheckpointManager(str(tmp_path))
    mgr.save(7, state, {"architecture": "LearnableSGD"})
    template = jax.eval_shape(lambda k: ot.init_outer_state(learner, ests, k), jax.random.key(1))
    restored, payload = C.restore(mgr.latest(), template, expect={"architecture": "LearnableSGD"})
    assert payload["step"] == 7
    assert jax.tree_util.tree_structure(restored) == jax.tree_util.tree_structure(state)
    np.testing.assert_array_equal(jax.random.key_data(restored.key), jax.random.key_data(state.key))
    chex.assert_trees_all_equal(jax.tree_util.tree_map(lambda x: x, restored.learner_state), state.learner_state)
    chex.assert_trees_all_equal(restored.estimator_states, state.estimator_states)


def _rewrite(path, **changes):
    """Rewrites the checkpoint at `path` with some of its entries changed (None removes an entry)."""
    from flax import serialization
    payload = serialization.msgpack_restore(open(path, "rb").read())
    payload.update(changes)
    payload = {k: v for k, v in payload.items() if v is not None}
    with open(path, "wb") as f:
        f.write(serialization.msgpack_serialize(payload))


def test_checksum_is_verified_before_anything_else(tmp_path):
    mgr = ot.CheckpointManager(str(tmp_path))
    path = mgr.save(3, {"theta": jnp.arange(4.0)}, {"architecture": "LearnableSGD"})[0]
    payload = C.read(path)
    assert payload["version"] == 2 and len(payload["checksum"]) == 64
    _rewrite(path, meta=json.dumps({"architecture": "LearnableSGE"}))  # content changed, checksum kept
    with pytest.raises(C.CorruptCheckpointError, match="ckpt_00000003.msgpack is corrupt: .*checksum"):
        C.restore(path, {"theta": jnp.zeros(4)}, expect={"architecture": "LearnableSGD"})


def test_version_1_files_are_read_with_a_warning(tmp_path):
    mgr = ot.CheckpointManager(str(tmp_path))
    path = mgr.save(3, {"theta": jnp.arange(4.0)}, {"architecture": "LearnableSGD"})[0]
    _rewrite(path, version=1, checksum=None)
    with pytest.warns(UserWarning, match="ckpt_00000003.msgpack has format version 1, which carries no checksum"):
        state, payload = C.restore(path, {"theta": jnp.zeros(4)}, expect={"architecture": "LearnableSGD"})
    np.testing.assert_array_equal(state["theta"], jnp.arange(4.0))
    _rewrite(path, version=3)
    with pytest.raises(C.CorruptCheckpointError, match="format version 3, which this lopt does not read"):
        C.read(path)

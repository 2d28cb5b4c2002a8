"""Fault injection: corrupt checkpoints in each way and check that a run either resumes bit-identically
from the newest good checkpoint (the bad ones set aside, with a warning naming them) or refuses with
a message naming every unreadable file, changing nothing on disk; no readable checkpoint or result
file is ever deleted, and a new run never starts over an earlier run's results unless asked."""
import json
import os
import shutil
import sys

import chex
import numpy as np
import pytest
from flax import serialization

import outer_trainers as ot
from outer_trainers.runs import checkpoint_files as C
from outer_trainers.runs.corrupt_checkpoints import UnreadableCheckpointsError
from outer_trainers.runs.run_checkpoints import ExistingRunError, RunCheckpoints

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import resume_job  # noqa: E402

STEPS = 6
POLICY = ot.CheckpointPolicy(every_steps=2, every_seconds=None, keep=3)
NEWEST = os.path.join("checkpoints", "ckpt_00000006.msgpack")


@pytest.fixture(scope="module")
def setup():
    return resume_job.build()


@pytest.fixture(scope="module")
def reference(setup, tmp_path_factory):
    """An uninterrupted run of STEPS steps with checkpoints at steps 2, 4 and 6: (its directory, its final state)."""
    learner, ests = setup
    out = str(tmp_path_factory.mktemp("reference") / "run")
    state = ot.outer_train(learner, ests, STEPS, output_dir=out, seed=3, reporting=ot.Reporting(progress=False),
                           checkpoint_policy=POLICY)
    return out, state


def _files(root) -> dict:
    """{relative path: bytes} of every file under `root`."""
    out = {}
    for d, _, names in os.walk(root):
        for n in names:
            path = os.path.join(d, n)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = f.read()
    return out


def _copy(reference, tmp_path) -> str:
    out = str(tmp_path / "run")
    shutil.copytree(reference[0], out)
    return out


def _run(setup, out, num_steps=STEPS, policy=POLICY, **kwargs):
    learner, ests = setup
    return ot.outer_train(learner, ests, num_steps, output_dir=out, seed=3, reporting=ot.Reporting(progress=False),
                          checkpoint_policy=policy,
                          **kwargs)


def _flip_theta_bit(raw: bytes) -> bytes:
    """`raw` (a checkpoint) with one bit flipped inside the bytes of its theta leaf."""
    payload = serialization.msgpack_restore(raw)
    paths = [p for p, _, _ in json.loads(payload["structure"])]
    index = next(i for i, p in enumerate(paths) if "theta" in p and "learner_state" in p)
    leaf = np.asarray(payload["leaves"][f"{index:06d}"]).tobytes()
    assert raw.count(leaf) == 1
    at = raw.index(leaf) + len(leaf) - 1
    return raw[:at] + bytes([raw[at] ^ 0x40]) + raw[at + 1:]


def _flip_meta_bit(raw: bytes) -> bytes:
    """`raw` with the architecture name in its metadata changed by one bit (LearnableSGD -> LearnableSGE)."""
    assert raw.count(b"LearnableSGD") == 1
    at = raw.index(b"LearnableSGD") + len("LearnableSG")
    return raw[:at] + bytes([raw[at] ^ 0x01]) + raw[at + 1:]


FAULTS = {
    "truncated": (lambda raw: raw[: len(raw) // 2], "not a readable lopt checkpoint"),
    "zero_length": (lambda raw: b"", "lopt checkpoint"),
    "random_bytes": (lambda raw: np.random.default_rng(0).bytes(len(raw)), "lopt checkpoint"),
    "bit_in_theta": (_flip_theta_bit, "does not match its checksum"),
    "bit_in_meta": (_flip_meta_bit, "does not match its checksum"),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_corrupt_newest_checkpoint_is_set_aside_and_the_run_resumes_exactly(setup, reference, tmp_path, fault):
    corrupt, why = FAULTS[fault]
    out = _copy(reference, tmp_path)
    with open(os.path.join(out, NEWEST), "rb") as f:
        bad = corrupt(f.read())
    with open(os.path.join(out, NEWEST), "wb") as f:
        f.write(bad)
    before = _files(out)
    with pytest.warns(UserWarning, match=rf"ckpt_00000006.msgpack moved aside to .*corrupt.*{why}"):
        state = _run(setup, out)
    # resumed from step 4 and retrained steps 5-6: bit-identical to the uninterrupted run
    chex.assert_trees_all_equal(state.theta, reference[1].theta)
    after = _files(out)
    assert after["theta_final.msgpack"] == before["theta_final.msgpack"]
    assert after[os.path.join("checkpoints", "corrupt", "ckpt_00000006.msgpack")] == bad  # set aside, not lost
    for step in (2, 4):  # readable checkpoints are kept as they were
        name = os.path.join("checkpoints", f"ckpt_{step:08d}.msgpack")
        assert after[name] == before[name]
    assert C.read(os.path.join(out, NEWEST))["step"] == STEPS  # rewritten, readable
    mgr = ot.CheckpointManager(os.path.join(out, "checkpoints"), POLICY)
    assert [s for s, _ in mgr.all()] == [6, 4, 2]  # the corrupt file is no longer listed
    assert [json.loads(line)["step"] for line in open(os.path.join(out, "metrics.jsonl"))] == list(range(1, 7))


def test_a_newer_unreadable_checkpoint_does_not_make_keep_1_delete_new_ones(setup, reference, tmp_path):
    out = _copy(reference, tmp_path)
    os.remove(os.path.join(out, NEWEST))  # the newest good one is step 4 ...
    junk = os.path.join(out, "checkpoints", "ckpt_00000099.msgpack")
    with open(junk, "wb") as f:  # ... and an unreadable one claims step 99
        f.write(b"\x00" * 64)
    with pytest.warns(UserWarning, match="ckpt_00000099.msgpack moved aside"):
        state = _run(setup, out, policy=ot.CheckpointPolicy(every_steps=2, every_seconds=None, keep=1))
    chex.assert_trees_all_equal(state.theta, reference[1].theta)
    assert sorted(os.listdir(os.path.join(out, "checkpoints"))) == ["ckpt_00000006.msgpack", "corrupt"]
    assert os.listdir(os.path.join(out, "checkpoints", "corrupt")) == ["ckpt_00000099.msgpack"]


def test_pruning_counts_only_readable_checkpoints(tmp_path):
    state = {"x": np.arange(3.0, dtype=np.float32)}
    mgr = ot.CheckpointManager(str(tmp_path), ot.CheckpointPolicy(keep=1, keep_best=1, every_seconds=None))
    os.makedirs(tmp_path / "best")
    for junk in (tmp_path / "ckpt_00000099.msgpack", tmp_path / "best" / "ckpt_00000099.msgpack"):
        junk.write_bytes(b"not a checkpoint")
    moved = r"ckpt_00000099.msgpack moved aside to .*corrupt.*not a readable lopt checkpoint"
    with pytest.warns(UserWarning, match=moved):
        assert mgr.save(7, state) == [str(tmp_path / "ckpt_00000007.msgpack")]
    assert [s for s, _ in mgr.list("rolling")] == [7]
    with pytest.warns(UserWarning, match=r"best.ckpt_00000099.msgpack moved aside to .*best-ckpt_00000099"):
        assert mgr.save_best(7, state, 1.0)
    assert [s for s, _ in mgr.list("best")] == [7]
    assert sorted(os.listdir(tmp_path / "corrupt")) == ["best-ckpt_00000099.msgpack", "ckpt_00000099.msgpack"]
    assert (tmp_path / "corrupt" / "ckpt_00000099.msgpack").read_bytes() == b"not a checkpoint"


def test_all_checkpoints_unreadable_refuses_and_changes_nothing(setup, reference, tmp_path):
    out = _copy(reference, tmp_path)
    for step in (2, 4, 6):
        path = os.path.join(out, "checkpoints", f"ckpt_{step:08d}.msgpack")
        with open(path, "r+b") as f:
            f.truncate(10)
    before = _files(out)
    with pytest.raises(UnreadableCheckpointsError) as info:
        _run(setup, out)
    message = str(info.value)
    for step in (2, 4, 6):
        assert f"ckpt_{step:08d}.msgpack: " in message
    assert "nothing was changed on disk" in message and "overwrite=True" in message
    assert _files(out) == before
    # asked explicitly, a new run starts over them, deleting the old run's results first
    fresh, _ = RunCheckpoints(out, POLICY).restore_or_init(lambda key: {"x": np.zeros(2)}, None, overwrite=True)
    assert fresh["x"].shape == (2,) and os.listdir(out) == []


def test_a_new_run_never_starts_over_a_finished_runs_results(setup, reference, tmp_path):
    out = _copy(reference, tmp_path)
    before = _files(out)
    with pytest.raises(ExistingRunError, match=r"checkpoints, metrics.jsonl, tb, theta_final.msgpack\) and "
                                               r"resume=False"):
        _run(setup, out, resume=False)
    assert _files(out) == before
    shutil.rmtree(os.path.join(out, "checkpoints"))  # a finished run whose checkpoints were removed
    before = _files(out)
    with pytest.raises(ExistingRunError, match=r"metrics.jsonl, tb, theta_final.msgpack\) and it has no checkpoint"):
        _run(setup, out)
    assert _files(out) == before

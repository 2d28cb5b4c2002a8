"""outer_trainers.devices: one CPU device per core unless the user chose, and TruncatedPES sharding
its pairs over several devices with the one-device estimate (multidevice marker)."""
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

import lopt
import outer_trainers as ot
import tasks
from outer_trainers import devices as D

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROBE = ("import jax, outer_trainers as ot; n = ot.use_all_cpu_cores({arg}); "
         "print(n, jax.device_count(), ot.use_all_cpu_cores())")


def _probe(env_extra, arg="", code=PROBE):
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES", "JAX_PLATFORMS")}
    env.update(env_extra, JAX_PLATFORMS="cpu")
    r = subprocess.run([sys.executable, "-c", code.format(arg=arg)], capture_output=True, text=True, env=env,
                       cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return [int(x) for x in r.stdout.split()]


def test_use_all_cpu_cores_unless_the_user_chose():
    """Fresh process: 3 devices when asked for 3 (a second call, after jax started, changes nothing);
    with XLA_FLAGS choosing 1 device it leaves that alone."""
    assert _probe({}, "3") == [3, 3, 0]
    assert _probe({"XLA_FLAGS": "--xla_force_host_platform_device_count=1"}, "3") == [0, 1, 0]


def test_block_size_with_one_cpu_device_per_core():
    """With one CPU device per core, MLPLOpt's block for batched updates is the per-core 1024 only
    where the batch is sharded over the devices (`features.sharded_updates`, as the sharded PES
    truncation runs); a one-device program in that process keeps the one-device 4096, and an update
    of one model the 32768 block (issue #16)."""
    code = ("import jax, lopt, outer_trainers as ot; ot.use_all_cpu_cores({arg}); "
            "ctx = lopt.features.batched_updates(); ctx.__enter__(); "
            "print(jax.device_count(), lopt.features.default_block_size(), lopt.MLPLOpt().block_size, "
            "lopt.features.default_block_size(batched=False)); "
            "sh = lopt.features.sharded_updates(jax.device_count()); sh.__enter__(); "
            "print(lopt.features.default_block_size(), lopt.MLPLOpt().block_size)")
    assert _probe({}, "3", code) == [3, 4096, 4096, 32768, 1024, 1024]


def test_shard_count_and_mesh_errors():
    cpus = [object()] * 4
    assert [D.shard_count(n, cpus) for n in (8, 6, 3, 7, 1)] == [4, 3, 3, 1, 1]
    assert D.shard_count(5, cpus[:1]) == 1
    assert D.particle_mesh(8, 1) is None
    with pytest.raises(ValueError, match="local devices are visible"):
        D.particle_mesh(8, len(jax.local_devices()) + 1)


def _pes_run(num_devices, num_tasks=4, truncs=3):
    lo = lopt.MLPLOpt(hidden_size=8, chunk_size=64)  # the 96-parameter matrix runs 2 blocks, the rest packs
    theta = lo.init(jax.random.key(0))
    family = tasks.ImageMLPFamily("digits", hidden_sizes=(8,), batch_size=16)
    step = ot.LOptTruncatedStep(family, lo, ot.LogUniformTruncationSchedule(3, 6))
    est = ot.TruncatedPES(step, num_tasks, 4, std=0.01, num_devices=num_devices, random_initial_iteration_offset=2)
    state = est.init_state(theta, jax.random.key(1))
    grads, losses = [], []
    for i in range(truncs):
        state, e = est.estimate(theta, state, jax.random.key(10 + i))
        grads.append(np.concatenate([np.ravel(x) for x in jax.tree_util.tree_leaves(e.grad)]))
        losses.append(float(e.loss))
    return est, theta, state, np.stack(grads), np.asarray(losses)


@pytest.mark.multidevice
def test_truncated_pes_shards_over_all_devices_with_the_one_device_estimate(compile_counter):
    if jax.device_count() < 4:
        pytest.fail("needs 4 devices: run with XLA_FLAGS=--xla_force_host_platform_device_count=4 -m multidevice")
    one = _pes_run(1)
    auto = _pes_run(None)
    assert one[0].num_devices == 1 and auto[0].num_devices == 4
    assert np.abs(one[3]).max() > 1e-3  # a real estimate, not zeros
    np.testing.assert_allclose(auto[3], one[3], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(auto[4], one[4], rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(auto[2].inner_state.inner_step), np.asarray(one[2].inner_state.inner_step))
    est, theta, state = auto[:3]
    with compile_counter() as c:
        est.estimate(theta, state, jax.random.key(99))
    assert c.count == 0


@pytest.mark.multidevice
def test_only_the_sharded_estimate_uses_per_core_blocks(monkeypatch):
    """With one CPU device per core, the learned optimizer inside TruncatedPES's sharded truncation
    is built for the per-core 1024 blocks, and inside an estimator that does not shard
    (NoiseReuseES, one device's program) for the one-device 4096 blocks, with which the benchmark's
    problem (d) trained its 16 tasks 1.3x faster in such a process (issue #16)."""
    if jax.device_count() < 4:
        pytest.fail("needs 4 devices: run with XLA_FLAGS=--xla_force_host_platform_device_count=4 -m multidevice")
    lo = lopt.MLPLOpt(hidden_size=8)
    build, blocks = lo.opt_fn, []
    monkeypatch.setattr(lo, "opt_fn", lambda *a, **k: (blocks.append(lopt.features.default_block_size()),
                                                       build(*a, **k))[1])
    family = tasks.ImageMLPFamily("digits", hidden_sizes=(8,), batch_size=16)
    step = ot.LOptTruncatedStep(family, lo, ot.LogUniformTruncationSchedule(3, 6))
    theta = lo.init(jax.random.key(0))
    seen = {}
    for est in (ot.TruncatedPES(step, 4, 2, std=0.01), ot.NoiseReuseES(step, 4, 2, std=0.01)):
        state = est.init_state(theta, jax.random.key(1))
        blocks.clear()
        est.estimate(theta, state, jax.random.key(2))
        seen[type(est).__name__] = set(blocks)
    assert seen == {"TruncatedPES": {lopt.features.BLOCK_PER_CORE}, "NoiseReuseES": {lopt.features.BLOCK_ONE_DEVICE}}
    assert lopt.features.default_block_size(batched=True) == lopt.features.BLOCK_ONE_DEVICE  # contexts left

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


def test_block_size_does_not_depend_on_the_devices():
    """MLPLOpt's blocks are a function of each tensor's size alone: the same with one CPU device per
    core as in this process."""
    sizes = (1000, 8192, 16384, 802816)
    code = ("import jax, lopt, outer_trainers as ot; ot.use_all_cpu_cores({arg}); "
            f"print(jax.device_count(), *[lopt.MLPLOpt().block_size(n) for n in {sizes}])")
    assert _probe({}, "3", code) == [3] + [lopt.MLPLOpt().block_size(n) for n in sizes] == [3, 1000, 1024, 1024, 32768]


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


@pytest.mark.slow  # test_sharded_truncated_pes checks the sharded estimate fast, on 4 devices
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

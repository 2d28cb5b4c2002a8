"""train_loop with the state split over a mesh axis (ParamSharding, FSDP): the split rule, the optimizer state
split like the parameters, the same numbers as one device, no recompilation, and checkpoints that resume split
or on one device.

The multi-device tests run in their own invocation:
    XLA_FLAGS=--xla_force_host_platform_device_count=4 pytest -m multidevice tests/outer_trainers/training
"""
import shutil

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

import lopt
import outer_trainers as ot
import tasks
from outer_trainers.runs.checkpoint_policy import CheckpointPolicy
from outer_trainers.training.train_sharding import addressable_bytes, shard_spec

AXIS = "fsdp"


class _Linear(tasks.Task):
    """A linear classifier of the 8x8 digits with a [64, 16] weight (16 logits, 10 used by the labels)."""

    def __init__(self, batch_size: int = 16):
        self.data, self.name = tasks.get_dataset("digits", batch_size), "linear_digits"

    def init(self, key):
        return {"w": jax.random.normal(key, (64, 16)) / 8.0, "b": jnp.zeros((16,))}

    def loss(self, params, key, batch):
        x = batch["image"].reshape(batch["image"].shape[0], -1).astype(jnp.float32) / 16.0
        return tasks.softmax_cross_entropy(x @ params["w"] + params["b"], batch["label"])


def _need_four_devices():
    if jax.device_count() < 4:
        pytest.fail("needs 4 devices: run with XLA_FLAGS=--xla_force_host_platform_device_count=4 -m multidevice")


def test_the_largest_divisible_dimension_is_split_and_small_or_indivisible_leaves_are_replicated():
    assert shard_spec((64, 10), AXIS, 4) == P(AXIS, None)
    assert shard_spec((10, 64), AXIS, 4) == P(None, AXIS)
    assert shard_spec((32, 32), AXIS, 4) == P(AXIS, None)  # the first of equal dimensions
    assert shard_spec((3, 64, 10), AXIS, 4) == P(None, AXIS, None)
    assert shard_spec((12, 64), AXIS, 8) == P(None, AXIS)  # 8 does not divide 12
    assert shard_spec((6, 10), AXIS, 4) == P()  # no dimension 4 divides
    assert shard_spec((2,), AXIS, 4) == P()
    assert shard_spec((), AXIS, 4) == P()
    assert shard_spec((64, 10), AXIS, 4, min_size=641) == P()  # 640 elements: too small to split
    assert shard_spec((64, 10), AXIS, 4, min_size=640) == P(AXIS, None)
    assert shard_spec((64, 10), AXIS, 1) == P()


def test_bad_sharding_arguments_are_refused_naming_the_cause():
    mesh = jax.make_mesh((1,), (AXIS,))
    with pytest.raises(TypeError, match="jax.sharding.Mesh"):
        ot.ParamSharding("fsdp")
    with pytest.raises(ValueError, match="'data' is not an axis of the mesh"):
        ot.ParamSharding(mesh, "data")
    with pytest.raises(ValueError, match="name the one to shard over"):
        ot.ParamSharding(jax.make_mesh((1, 1), ("a", "b")))
    with pytest.raises(ValueError, match="min_size"):
        ot.ParamSharding(mesh, min_size=-1)
    task = _Linear()
    with pytest.raises(ValueError, match="devices or sharding, not both"):
        ot.train_loop(task, optax.adam(0.1), 2, sharding=ot.ParamSharding(mesh), devices=jax.devices()[:1])
    with pytest.raises(TypeError, match="must be a ParamSharding"):
        ot.train_loop(task, optax.adam(0.1), 2, sharding=mesh)
    plan = ot.ParamSharding(mesh)
    assert plan.axis == AXIS and plan.mesh.axis_types == (jax.sharding.AxisType.Auto,)  # explicit axes: automatic
    assert plan == ot.ParamSharding(jax.make_mesh((1,), (AXIS,))) and hash(plan) == hash(ot.ParamSharding(mesh))


@pytest.mark.multidevice
def test_a_learned_optimizer_trains_split_over_four_devices_as_on_one(compile_counter):
    """celo2_v5 on a linear classifier: params, optimizer state and EMA split over 4 devices, the batch too."""
    _need_four_devices()
    task = _Linear()
    tx = lopt.pretrained.load("celo2_v5", num_steps=8, layout="sharded")
    plan = ot.ParamSharding(jax.make_mesh((4,), (AXIS,)), min_size=256)
    kw = dict(ema_decay=0.9, evaluation=ot.EvalPlan(evals=()),
              options=ot.LoopOptions(chunk_size=2, log_every=2, yield_every=2, tensorboard=False))
    with pytest.raises(ValueError, match="batch size 18 cannot be split over mesh axis 'fsdp' of 4 devices"):
        ot.train_loop(_Linear(batch_size=18), tx, 8, sharding=plan, **kw)

    loop = ot.train_loop(task, tx, 8, sharding=plan, **kw)
    states = [next(loop)]  # the first chunk compiles the step and the norm
    with compile_counter() as c:
        states += [next(loop) for _ in range(3)]
        sharded = ot.run_to_end(loop)
    assert c.count == 0, f"{c.count} compilations after the first chunk"
    assert [int(s.step) for s in states] == [2, 4, 6, 8]

    state = sharded.state
    spec = lambda x: x.sharding.spec
    assert spec(state.params["w"]) == P(AXIS, None) and spec(state.params["b"]) == P()
    assert spec(state.ema_params["w"]) == P(AXIS, None)
    inner = {f: optax.tree_utils.tree_get(state.opt_state, f) for f in ("momenta", "second_moment")}  # inside the rules
    assert spec(inner["momenta"]["w"]) == P(None, AXIS, None)  # [K, *p.shape]
    assert spec(inner["second_moment"]["w"]) == P(AXIS, None)
    assert len(state.params["w"].sharding.device_set) == 4

    one = ot.train_model(task, tx, 8, devices=jax.devices()[:1], **dict(kw, options=ot.LoopOptions(
        chunk_size=2, log_every=2, tensorboard=False)))
    large = [(a, b) for a, b in zip(jax.tree_util.tree_leaves(state.opt_state),
                                    jax.tree_util.tree_leaves(one.state.opt_state)) if a.size >= 256]
    assert len(large) == 2  # the momenta and second moment of w
    for a, b in large:  # each device holds a quarter of every large optimizer-state leaf
        assert a.addressable_shards[0].data.nbytes * 4 == b.addressable_shards[0].data.nbytes == b.nbytes
    ratio = addressable_bytes(state.opt_state) / addressable_bytes(one.state.opt_state)
    assert 0.25 <= ratio < 0.3, ratio  # the small leaves (b's, the step count) stay whole

    # the same run, up to the order of float sums (shards add in another order; Newton-Schulz carries it)
    np.testing.assert_allclose(sharded.losses, one.losses, rtol=1e-4)
    np.testing.assert_allclose(sharded.grad_norms, one.grad_norms, rtol=1e-4)
    for got, want in ((state.params, one.state.params), (state.ema_params, one.state.ema_params),
                      (state.opt_state, one.state.opt_state)):
        chex.assert_trees_all_close(jax.device_get(got), jax.device_get(want), rtol=1e-4, atol=1e-6)
    assert sharded.losses[-1] < sharded.losses[0]


@pytest.mark.slow
@pytest.mark.multidevice
def test_a_split_run_checkpoints_whole_arrays_and_resumes_split_or_on_one_device(tmp_path):
    _need_four_devices()
    task = _Linear()
    plan = ot.ParamSharding(jax.make_mesh((4,), (AXIS,)), min_size=256)
    kw = dict(ema_decay=0.9, evaluation=ot.EvalPlan(evals=()), options=ot.LoopOptions(chunk_size=4, log_every=4, tensorboard=False),
              checkpoint_policy=CheckpointPolicy(every_steps=4, every_seconds=None))
    straight = ot.train_model(task, optax.adam(1e-2), 8, sharding=plan, **kw)

    out = str(tmp_path / "run")
    loop = ot.train_loop(task, optax.adam(1e-2), 8, sharding=plan, output_dir=out,
                         **dict(kw, options=ot.LoopOptions(chunk_size=4, log_every=4, yield_every=4, tensorboard=False)))
    assert int(next(loop).step) == 4
    loop.close()  # interrupted after the checkpoint at step 4
    shutil.copytree(out, str(tmp_path / "copy"))

    resumed = ot.train_model(task, optax.adam(1e-2), 8, sharding=plan, output_dir=out, **kw)
    w = resumed.state.params["w"]
    assert w.sharding.spec == P(AXIS, None) and len(w.sharding.device_set) == 4
    assert resumed.state.opt_state[0].mu["w"].sharding.spec == P(AXIS, None)
    chex.assert_trees_all_equal(jax.device_get(resumed.state), jax.device_get(straight.state))
    np.testing.assert_array_equal(resumed.losses, straight.losses)

    on_one = ot.train_model(task, optax.adam(1e-2), 8, devices=jax.devices()[:1], output_dir=str(tmp_path / "copy"),
                            **kw)
    assert len(on_one.state.params["w"].sharding.device_set) == 1
    np.testing.assert_array_equal(on_one.losses[:4], straight.losses[:4])  # the sharded run's steps, read back
    np.testing.assert_allclose(on_one.losses, straight.losses, rtol=1e-5)
    chex.assert_trees_all_close(jax.device_get(on_one.state.params), jax.device_get(straight.state.params),
                                rtol=1e-5, atol=1e-6)

"""train_model: any optax transform on a Task or a model; EMA; checkpoint/resume (its original signature); data
parallel on 4 simulated devices."""
import os

import chex
import haiku as hk
import jax
import numpy as np
import optax
import pytest

import lopt
import outer_trainers as ot
import tasks
from outer_trainers.training.train_eval import Evaluation
from outer_trainers.training.train_state import data_parallel_sharding

TASK = tasks.QuadraticFamily(dim=4).task_fn(tasks.QuadraticFamily(dim=4).sample(jax.random.key(0)))


def test_baseline_and_learned_optimizers_train_a_task():
    adam = ot.train_model(TASK, optax.adam(0.1), 30, seed=1, ema_decay=0.9)
    assert adam.losses.shape == (30,) and adam.losses[-1] < 0.2 * adam.losses[0]
    assert adam.ema_eval_loss is not None and np.isfinite(adam.ema_eval_loss)
    lo = lopt.LearnableSGD(0.3)
    learned = ot.train_model(TASK, lo.opt_fn(lo.init(jax.random.key(0))), 30, seed=1)
    assert learned.losses[-1] < 0.5 * learned.losses[0] and learned.ema_eval_loss is None


def test_checkpoint_resume_matches_a_straight_run(tmp_path):
    straight = ot.train_model(TASK, optax.adam(0.05), 12, seed=2, options=ot.LoopOptions(chunk_size=4))
    ck = str(tmp_path / "ck")
    ot.train_model(TASK, optax.adam(0.05), 12, seed=2, options=ot.LoopOptions(chunk_size=4), checkpoint_dir=ck,
                   checkpoint_every=4, keep=5)
    os.remove(os.path.join(ck, "ckpt_00000012.msgpack"))  # as if killed after step 8
    os.remove(os.path.join(ck, "ckpt_00000008.msgpack"))
    resumed = ot.train_model(TASK, optax.adam(0.05), 12, seed=2, options=ot.LoopOptions(chunk_size=4),
                             checkpoint_dir=ck, checkpoint_every=4)
    np.testing.assert_array_equal(resumed.losses, straight.losses)
    chex.assert_trees_all_equal(resumed.state.params, straight.state.params)


def test_a_model_without_a_task_needs_loss_and_data():
    with pytest.raises(ValueError, match="loss_fn= and data="):
        ot.train_model(lambda x: x, optax.adam(0.1), 1)


@pytest.mark.multidevice
def test_data_parallel_over_four_devices_matches_one_device():
    """Run as: XLA_FLAGS=--xla_force_host_platform_device_count=4 pytest -m multidevice."""
    if jax.device_count() < 4:
        pytest.fail("needs 4 devices: run with XLA_FLAGS=--xla_force_host_platform_device_count=4 -m multidevice")
    data = tasks.get_dataset("digits", 32)
    model = lambda x: hk.Linear(10)(hk.Flatten()(x.astype(np.float32) / 16.0))
    loss = lambda logits, batch: tasks.softmax_cross_entropy(logits, batch["label"])
    sharding = data_parallel_sharding(data)
    assert sharding is not None and sharding.mesh.size == 4
    other = Evaluation("outer_valid", "ov", data=tasks.get_dataset("digits", 16), num_batches=2)
    kw = dict(loss_fn=loss, data=data, seed=0, ema_decay=0.9, evaluation=ot.EvalPlan(evals=["test", other], every=5),
              options=ot.LoopOptions(chunk_size=4))
    dp = ot.train_model(model, optax.adam(1e-2), 10, **kw)
    one = ot.train_model(model, optax.adam(1e-2), 10, devices=jax.local_devices()[:1], **kw)
    assert len(jax.tree_util.tree_leaves(dp.state.params)[0].sharding.device_set) == 4
    assert len(jax.tree_util.tree_leaves(one.state.params)[0].sharding.device_set) == 1
    np.testing.assert_allclose(dp.losses, one.losses, rtol=1e-5, atol=1e-6)
    chex.assert_trees_all_close(dp.state.ema_params, one.state.ema_params, rtol=1e-5, atol=1e-6)
    assert set(dp.evals) == set(one.evals) and "eval/ov/accuracy" in dp.evals
    for name in dp.evals:
        np.testing.assert_allclose(dp.evals[name], one.evals[name], rtol=1e-5, atol=1e-6, err_msg=name)
    assert dp.losses[-1] < dp.losses[0]

"""ConvBNTask / ConvBNFamily: BatchNorm's running statistics as model state, dropout in training only,
inference-mode held-out losses in the evaluation."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import tasks
from outer_trainers.evaluation import run_fixed, task_draws
from outer_trainers.evaluation.task_trainer import held_out_metrics


@pytest.fixture(scope="module")
def digits():
    return tasks.get_dataset("digits", 32)


def test_training_updates_the_running_statistics_and_drops_features_by_the_key(digits):
    task = tasks.ConvBNTask(digits, (4,), dropout=0.5)
    assert task.name == "conv_bn_digits_4_drop0.5"
    params, state = jax.jit(task.init_with_state)(jax.random.key(0))
    assert sorted(state) == ["batch_norm/~/mean_ema", "batch_norm/~/var_ema"]
    batch = digits.batch(jax.random.key(1), "train")

    @jax.jit  # one program: op-by-op haiku is slow on a busy CPU
    def probe(params, state, batch):
        (loss_a, new_state), (loss_b, _) = (task.loss_with_state(params, state, jax.random.key(k), batch) for k in (2, 3))
        evals = [task.eval_loss(params, new_state, k, batch) for k in (jax.random.key(4), None)]
        return loss_a, loss_b, new_state, evals, task.logits(params, batch["image"], new_state)

    loss_a, loss_b, new_state, evals, logits = probe(params, state, batch)
    assert loss_a != loss_b  # dropout's mask comes from the loss key
    assert not np.allclose(new_state["batch_norm/~/mean_ema"]["average"], state["batch_norm/~/mean_ema"]["average"])
    # inference: the running statistics, no dropout: deterministic, whatever the key
    assert evals[0] == evals[1] and np.isfinite(evals[0])
    assert logits.shape == (32, 10) and np.all(np.isfinite(logits))
    assert tasks.ConvBNTask(digits, (4, 8), dropout=0.0).name == "conv_bn_digits_4x8"
    with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\)"):
        tasks.ConvBNTask(digits, (4,), dropout=1.0)


def test_without_dropout_the_training_loss_does_not_depend_on_the_key(digits):
    task = tasks.ConvBNTask(tasks.datasets.signals1d(16, num_examples=200), (4,), kernel_size=5, dropout=0.0)
    params, state = jax.jit(task.init_with_state)(jax.random.key(0))
    batch = task.data.batch(jax.random.key(1), "train")
    loss = jax.jit(lambda k: task.loss_with_state(params, state, k, batch)[0])
    assert loss(jax.random.key(2)) == loss(jax.random.key(3))


def test_the_family_reports_its_static_config_and_its_held_out_loss_is_the_inference_loss(digits):
    fam = tasks.ConvBNFamily("digits", (4, 8), dropout=0.2, batch_size=32, activations=("relu",))
    assert tasks.suites.static_configs(fam) == [(("activation", "relu"), ("batch_size", 32), ("channels", (4, 8)),
                                                 ("dataset", "digits"), ("dropout", 0.2), ("kernel_size", 3),
                                                 ("kind", "conv_bn"))]
    task = fam.task_fn(fam.sample(jax.random.key(0)))
    assert held_out_metrics(task)["loss"] == task.eval_loss and "accuracy" in held_out_metrics(task)
    mlp = tasks.ImageMLPTask(digits, (8,))
    assert held_out_metrics(mlp)["loss"] is not None and not hasattr(mlp, "eval_loss")


@pytest.mark.slow
def test_a_batchnorm_dropout_convnet_trains_and_is_scored_in_inference_mode():
    fam = tasks.ConvBNFamily("digits", (4, 8), dropout=0.2, batch_size=32, activations=("relu",))
    cfgs, keys = task_draws(fam, (0, 1))
    run = run_fixed(fam, "adam", optax.adam, jnp.float32(1e-2), cfgs, keys, 30, sequential=True)
    assert np.all(np.isfinite(run["evals"])) and np.all(run["losses"][:, -5:].mean(1) < run["losses"][:, 0])
    assert np.all((run["accuracy"] > 0.2) & (run["accuracy"] <= 1.0))  # above chance (0.1) after 30 steps

"""tasks.autoencoder: the MLP autoencoder task and family, and the trivial_loss contract (the loss
of the best input-independent prediction) of the autoencoder and of linear regression."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import tasks
from tasks import registry, suites
from tasks.datasets import DatasetNotFoundError, from_arrays, locate
from tests.tasks.task_checks import check_family


@pytest.fixture(scope="module")
def digits_ae():
    return tasks.AutoencoderTask("digits", (32, 8, 32), batch_size=64)


def _mean_image_mse(data, split):
    """Independently of the task: numpy, float64, every example of `split`, the train split's mean image."""
    train = np.asarray(data.splits["train"]["image"], np.float64).reshape(data.num_examples("train"), -1)
    x = np.asarray(data.splits[split]["image"], np.float64).reshape(data.num_examples(split), -1)
    return float(np.mean((x - train.mean(axis=0)) ** 2))


def test_trivial_loss_is_the_mse_of_the_train_mean_image_on_the_reported_split(digits_ae):
    assert digits_ae.trivial_loss() == pytest.approx(_mean_image_mse(digits_ae.data, "test"), rel=1e-12)
    assert digits_ae.trivial_loss("train") == pytest.approx(_mean_image_mse(digits_ae.data, "train"), rel=1e-12)
    assert digits_ae.trivial_loss() == pytest.approx(0.0742, abs=5e-4)  # the collapsed run's loss in the issue
    assert digits_ae.trivial_loss("train") < digits_ae.trivial_loss()  # the mean is fitted on train
    with pytest.raises(KeyError, match="has no split 'valid'"):
        digits_ae.trivial_loss("valid")


def test_a_network_predicting_the_mean_image_scores_the_trivial_loss(digits_ae):
    """What the trivial loss stands for: every ReLU dead, the output is its bias, at best the mean image."""
    params = jax.tree_util.tree_map(jnp.zeros_like, digits_ae.init(jax.random.key(0)))
    out = sorted(params)[-1]  # haiku names the layers linear, linear_1, ..., the output last
    assert out == "linear_3" and params[out]["b"].shape == (64,)
    train = np.asarray(digits_ae.data.splits["train"]["image"]).reshape(-1, 64)
    params[out]["b"] = jnp.asarray(train.mean(axis=0))
    loss = digits_ae.loss(params, None, digits_ae.data.splits["test"])  # the whole split as one batch
    assert float(loss) == pytest.approx(digits_ae.trivial_loss(), rel=1e-5)


def test_adam_trains_the_autoencoder_well_below_its_trivial_loss_in_a_few_hundred_steps(digits_ae):
    tx = optax.adam(3e-3)
    data = digits_ae.data

    @jax.jit
    def train(key):
        params = digits_ae.init(jax.random.fold_in(key, 0))

        def step(carry, k):
            params, opt_state = carry
            loss, grads = jax.value_and_grad(digits_ae.loss)(params, k, data.batch(k, "train"))
            updates, opt_state = tx.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), loss

        (params, _), losses = jax.lax.scan(step, (params, tx.init(params)), jax.random.split(key, 400))
        return losses, digits_ae.loss(params, key, data.splits["test"])

    losses, test_loss = train(jax.random.key(0))
    assert float(losses[0]) > digits_ae.trivial_loss("train")  # an untrained network is worse than the mean
    assert float(jnp.mean(losses[-40:])) < 0.6 * digits_ae.trivial_loss("train")
    assert float(test_loss) < 0.6 * digits_ae.trivial_loss()


def test_the_network_shape_and_loss(digits_ae):
    params = digits_ae.init(jax.random.key(1))
    shapes = [params[k]["w"].shape for k in sorted(params)]
    assert shapes == [(64, 32), (32, 8), (8, 32), (32, 64)]  # the 64-32-8-32-64 autoencoder
    batch = digits_ae.data.batch(jax.random.key(2), "train")
    assert batch["image"].shape == (64, 8, 8, 1)
    x = np.asarray(batch["image"]).reshape(64, -1)
    want = np.mean((np.asarray(digits_ae.reconstruct(params, batch["image"])) - x) ** 2)
    assert float(digits_ae.loss(params, None, batch)) == pytest.approx(float(want), rel=1e-5)
    # uint8 images are scaled to [0, 1]: the same images as uint8 give the same loss
    as_uint8 = {"image": jnp.asarray(np.round(x.reshape(64, 8, 8, 1) * 255).astype(np.uint8))}
    rounded = np.round(x * 255) / 255
    want8 = np.mean((np.asarray(digits_ae.reconstruct(params, as_uint8["image"])) - rounded) ** 2)
    assert float(digits_ae.loss(params, None, as_uint8)) == pytest.approx(float(want8), rel=1e-5)


def test_family_samples_tasks_without_recompiling_and_normalises_near_one(compile_counter):
    # init scales near 1: the scale compounds over the 4 layers (the output's std grows as s^4)
    family = tasks.AutoencoderFamily("digits", (32, 8, 32), batch_size=16, init_scale_range=(0.8, 1.25),
                                     activations=("relu", "tanh", "gelu"))
    _, normalised = check_family(family, compile_counter)
    assert np.all(np.asarray(normalised) > 0.5)  # an untrained network is no better than predicting zeros
    task = family.task_fn(family.sample(jax.random.key(0)))
    assert task.trivial_loss() == pytest.approx(_mean_image_mse(family.data, "test"), rel=1e-12)


def test_static_configs_of_the_family_and_construction_reads_no_file(monkeypatch, tmp_path):
    family = tasks.AutoencoderFamily("digits", (32, 8, 32), batch_size=64, activations=("relu", "tanh"))
    assert suites.static_configs(tasks.ScaleReparam(family, (0.5, 2.0))) == [
        (("activation", act), ("batch_size", 64), ("dataset", "digits"), ("hidden_sizes", (32, 8, 32)),
         ("kind", "autoencoder")) for act in ("relu", "tanh")]
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("LOPT_DATA_DIR", raising=False)
    monkeypatch.setattr(locate, "SYSTEM_DIRS", {})
    monkeypatch.setattr(registry, "_CACHE", {})
    fmnist = tasks.AutoencoderFamily("fashion_mnist_14", (64, 16, 64))  # no file is read here
    assert suites.static_configs(fmnist)[0][2] == ("dataset", "fashion_mnist_14")
    with pytest.raises(DatasetNotFoundError, match="dataset 'fashion_mnist'"):
        fmnist.data


def test_wrong_arguments_are_refused():
    with pytest.raises(ValueError, match="needs a DataSource with 'image'"):
        tasks.AutoencoderTask(from_arrays({"x": np.zeros((40, 3), np.float32)}, 4))
    with pytest.raises(ValueError, match="hidden_sizes must be one or more widths"):
        tasks.AutoencoderTask("digits", ())
    with pytest.raises(ValueError, match="unknown activation 'sigmoid'"):
        tasks.AutoencoderFamily("digits", activations=("sigmoid",))
    with pytest.raises(ValueError, match="unknown dataset 'nope'"):
        tasks.AutoencoderFamily("nope")


def test_linear_regression_trivial_loss_is_the_expected_loss_of_predicting_the_mean_target():
    family = tasks.LinearRegressionFamily(20, batch_size=32, condition=100.0, noise_range=(0.3, 0.3), seed=3)
    cfg = family.sample(jax.random.key(0))
    task = family.task_fn(cfg)
    x_train = np.asarray(family.data.splits["train"]["x"], np.float64)
    w = np.asarray(cfg["w_star"], np.float64)
    y_bar = (x_train @ w).mean()
    for split in ("test", "train"):
        x = np.asarray(family.data.splits[split]["x"], np.float64)
        want = 0.5 * np.mean((x @ w - y_bar) ** 2) + 0.5 * 0.3 ** 2
        assert task.trivial_loss(split) == pytest.approx(want, rel=1e-5)
    assert isinstance(task.trivial_loss(), float)
    # built from a traced cfg inside jit it is a traced scalar, with the same value
    traced = jax.jit(lambda c: family.task_fn(c).trivial_loss())(cfg)
    assert float(traced) == pytest.approx(task.trivial_loss(), rel=1e-5)
    # the constant prediction's loss, measured on sampled test batches with their label noise
    params_mean = {"w": jnp.zeros(20)}  # predicts 0, which is ȳ up to a small offset here
    assert abs(y_bar) < 0.05
    losses = jax.vmap(lambda k: task.loss(params_mean, k, family.data.batch(k, "test")))(
        jax.random.split(jax.random.key(1), 400))
    assert float(jnp.mean(losses)) == pytest.approx(task.trivial_loss(), rel=0.1)

"""Augmentation semantics, host-side family sampling, and small task-specific facts."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tasks
from tasks import registry
from tasks.datasets import DatasetNotFoundError, locate
from tasks.families import sample_family_for_period
from tasks.functions2d import FUNCTIONS
from tests.tasks.datasets.conftest import write_fake_mnist


@pytest.fixture(scope="module")
def quad():
    return tasks.QuadraticFamily(6, normalize=True)


def _grad(task, params, state, key, batch=None):
    return jax.grad(lambda p: task.loss_with_state(p, state, key, batch)[0])(params)


def test_scale_reparam_rescales_params_and_grads(quad):
    fam = tasks.ScaleReparam(quad, (0.1, 10.0))
    cfg = fam.sample(jax.random.key(0))
    task, inner = fam.task_fn(cfg), quad.task_fn(cfg["inner"])
    c = cfg["scales"]["x"]
    (p, s), (pi, si) = task.init_with_state(jax.random.key(1)), inner.init_with_state(jax.random.key(1))
    chex.assert_trees_all_close(p["x"] * c, pi["x"], rtol=1e-6)
    np.testing.assert_allclose(task.loss_with_state(p, s, jax.random.key(2), None)[0],
                               inner.loss_with_state(pi, si, jax.random.key(2), None)[0], rtol=1e-6)
    chex.assert_trees_all_close(_grad(task, p, s, jax.random.key(2))["x"],
                                c * _grad(inner, pi, si, jax.random.key(2))["x"], rtol=1e-5)


def test_gradient_noise_keeps_value_changes_grad(quad):
    fam = tasks.GradientNoise(quad, (0.5, 0.5))
    cfg = fam.sample(jax.random.key(0))
    task, inner = fam.task_fn(cfg), quad.task_fn(cfg["inner"])
    p, s = task.init_with_state(jax.random.key(1))
    k = jax.random.key(2)
    k_inner = jax.random.split(k)[0]
    np.testing.assert_allclose(task.loss_with_state(p, s, k, None)[0], inner.loss_with_state(p, s, k_inner, None)[0],
                               rtol=1e-6)
    diff = _grad(task, p, s, k)["x"] - _grad(inner, p, s, k_inner)["x"]
    assert 0.1 < float(jnp.std(diff)) < 1.5  # ~N(0, 0.5²) per entry


def test_reduced_batch_size_and_init_loss_normalisation():
    reg = tasks.LinearRegressionFamily(4, batch_size=32, num_examples=256)
    small = tasks.ReducedBatchSize(reg, 8)
    assert small.data.batch(jax.random.key(0))["x"].shape == (8, 4)
    assert small.task_fn(small.sample(jax.random.key(0))).data.batch_size == 8
    with pytest.raises(ValueError, match="batch_size"):
        tasks.ReducedBatchSize(reg, 64)
    fam = tasks.NormalizeByInitialLoss(reg)
    task = fam.task_fn(fam.sample(jax.random.key(0)))
    p, s = task.init_with_state(jax.random.key(1))
    b = reg.data.batch(jax.random.key(2))
    l1, s1 = task.loss_with_state(p, s, jax.random.key(3), b)
    np.testing.assert_allclose(l1, 1.0, rtol=1e-6)
    p2 = jax.tree_util.tree_map(lambda x: 0.5 * x, p)
    l2, s2 = task.loss_with_state(p2, s1, jax.random.key(3), b)
    inner = reg.task_fn(fam.sample(jax.random.key(0)))
    np.testing.assert_allclose(l2 * s1["initial_loss"], inner.loss(p2, jax.random.key(3), b), rtol=1e-5)
    assert float(s2["initial_loss"]) == float(s1["initial_loss"])


def test_a_family_reads_no_file_until_its_data_is_used(monkeypatch, tmp_path):
    """Building (and wrapping) a family is its static description; the dataset loads on first use of
    `data` (by task_fn, sample's shapes, training), which reports missing files, inside jit too."""
    monkeypatch.delenv("LOPT_DATA_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(locate, "SYSTEM_DIRS", {})  # only what this test writes is found
    monkeypatch.setattr(registry, "_CACHE", {})
    inner = tasks.ImageMLPFamily("fashion_mnist_7", (8,), batch_size=32, activations=("tanh",))
    family = tasks.ReducedBatchSize(tasks.GradientNoise(tasks.ScaleReparam(inner)), 8)
    assert (inner.dataset, inner.batch_size, family.batch_size) == ("fashion_mnist_7", 32, 8)
    assert family.name == "image_mlp_family_fashion_mnist_7_8_reparam_gradnoise_bs8"
    assert tasks.suites.static_configs(family) == [(("activation", "tanh"), ("batch_size", 8),
                                                    ("dataset", "fashion_mnist_7"), ("hidden_sizes", (8,)),
                                                    ("kind", "image_mlp"), ("norm", None))]
    with pytest.raises(ValueError, match="batch_size must be in \\[1, 32\\]"):
        tasks.ReducedBatchSize(inner, 64)
    with pytest.raises(ValueError, match="unknown dataset 'fashion_mnist_77'"):  # a typo still fails at once
        tasks.ImageMLPFamily("fashion_mnist_77")

    key = jax.random.key(0)
    init = jax.jit(lambda k: family.task_fn(family.sample(k)).init(k))
    missing = (r"dataset 'fashion_mnist': looked for \['train-images-idx3-ubyte.gz'.*\.cache/lopt/fashion_mnist"
               r".*apt-get install dataset-fashion-mnist")
    for first_use in (lambda: family.data, lambda: inner.task_fn(inner.sample(key)), lambda: family.sample(key),
                      lambda: init(key)):
        with pytest.raises(DatasetNotFoundError, match=missing):
            first_use()

    write_fake_mnist(tmp_path / ".cache" / "lopt" / "fashion_mnist")
    params = init(key)  # the first load runs while jit traces: the cached arrays must be concrete
    assert params["linear"]["w"].shape == (49, 8)
    assert family.data.batch_size == 8 and inner.data.batch_size == 32 and inner.data.num_classes == 10
    for leaf in jax.tree_util.tree_leaves(registry.get_dataset("fashion_mnist_7", 32)):
        assert np.asarray(leaf).shape[1:] in ((7, 7, 1), ())  # a leaked tracer would raise here
    assert family.data.batch(key)["image"].shape == (8, 7, 7, 1)


def test_host_samplers_are_deterministic_and_varied():
    a = [tasks.sample_task_family(s).name for s in range(12)]
    assert a == [tasks.sample_task_family(s).name for s in range(12)]
    assert len({n.split("_family")[0].split("_dim")[0] for n in a}) >= 3
    fam = tasks.sample_image_mlp(np.random.default_rng(3))
    assert isinstance(fam, tasks.ImageMLPFamily) and fam.dataset in ("digits", "signals1d")
    assert tasks.sample_conv(jax.random.key(1)).name == tasks.sample_conv(jax.random.key(1)).name
    aug = [tasks.sample_task_family(s, augment_prob=1.0).name for s in range(12)]
    assert any(k in n for n in aug for k in ("reparam", "gradnoise", "initnorm", "_bs"))


def test_family_for_period_is_deterministic_per_seed_and_period():
    fams = [sample_family_for_period(7, k, tasks.sample_quadratic) for k in range(6)]
    assert [f.name for f in fams] == [sample_family_for_period(7, k, tasks.sample_quadratic).name for k in range(6)]
    assert len({f.name for f in fams}) > 1
    # the draw is the sampler given numpy's Generator seeded with [seed, period]
    assert fams[4].name == tasks.sample_quadratic(np.random.default_rng([7, 4])).name
    assert sample_family_for_period(0, 2).name == tasks.sample_task_family(np.random.default_rng([0, 2])).name


def test_classic_functions_minima():
    for xy in [(1.0, 1.0)]:
        assert float(FUNCTIONS["rosenbrock"][0](jnp.array(xy))) == 0.0
    assert float(FUNCTIONS["himmelblau"][0](jnp.array([3.0, 2.0]))) == 0.0
    assert float(FUNCTIONS["beale"][0](jnp.array([3.0, 0.5]))) == 0.0
    t = tasks.RosenbrockTask()
    np.testing.assert_allclose(t.normalizer(t.loss(t.init(jax.random.key(0)), None)), 1.0)


def test_stateful_tasks_refuse_plain_loss():
    d = tasks.get_dataset("digits", 8)
    t = tasks.ImageMLPTask(d, (8,), norm="batch")
    p, s = t.init_with_state(jax.random.key(0))
    with pytest.raises(NotImplementedError, match="loss_with_state"):
        t.loss(p, None, d.batch(jax.random.key(1)))
    with pytest.raises(ValueError, match="norm"):
        tasks.ImageMLPTask(d, (8,), norm="group")

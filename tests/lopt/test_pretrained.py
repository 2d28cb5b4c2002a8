"""lopt.pretrained: a shipped optimizer's record and theta file load, carry the config of its gin recipe
(scripts/configs, the recipe's one home), pass their checksum, and train a held-out task (not one of
the recipe's) below its initial loss; no record or recipe names a path that no longer exists.

`check_shipped` is the contract every shipped optimizer meets. It runs on every name the package
ships, and on a stand-in package directory built here from the committed recipe and a freshly
initialised theta, so the machinery is tested whether or not a meta-trained theta is shipped.
"""
import dataclasses
import glob
import hashlib
import importlib
import json
import os
import pkgutil
import re
import warnings

import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lopt
from outer_trainers import gin_registry  # noqa: F401  (registers lopt's names with gin)
from tasks import suites

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPE = "normmlp_v1"  # scripts/configs/pretrained_normmlp_v1.gin


def check_shipped(name: str, meta_trained: bool = True) -> None:
    """The contract of a shipped optimizer (see the module docstring)."""
    record = lopt.pretrained.info(name)
    for key in lopt.pretrained.REQUIRED_INFO:
        assert record[key] not in (None, "", [], {}), key
    # the recipe is the gin file in scripts/configs (its one home), and the one documented command runs it
    assert record["recipe"] == f"scripts/configs/pretrained_{name}.gin" and "gin_config" not in record
    with open(os.path.join(ROOT, record["recipe"]), encoding="utf-8") as f:
        recipe = f.read()
    assert f"--gin_file {record['recipe']}" in record["command"]
    assert isinstance(record["results"], list) and len(record["results"]) <= 4
    with open(lopt.pretrained.theta_path(name), "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == record["theta_sha256"]
    learned_opt, theta = lopt.pretrained.load_learned_optimizer_by_name(name)
    assert learned_opt.name == record["architecture"] and learned_opt.config() == record["config"]
    gin.clear_config()  # the architecture the recipe's bindings build is the one in the file
    try:
        gin.parse_config(recipe, skip_unknown=True)
        built = lopt.architecture(record["architecture"])(**gin.get_bindings(record["architecture"]))
    finally:
        gin.clear_config()
    assert built.config() == learned_opt.config()
    if meta_trained:  # not an initial theta
        fresh = learned_opt.init(jax.random.key(0))
        assert any(not np.allclose(a, b) for a, b in zip(jax.tree_util.tree_leaves(theta),
                                                          jax.tree_util.tree_leaves(fresh)))
    # a held-out task: the smoke suite's digits MLP (width 16, tanh, batch 32), 60 steps
    spec = next(t for t in suites.get("smoke") if t.kind == "image_mlp")
    family = spec.build()
    task = family.task_fn(family.sample(jax.random.key(0)))
    tx = lopt.pretrained.load(name, num_steps=spec.num_steps)
    params, state = task.init_with_state(jax.random.key(1))

    def step(carry, key):
        params, state, opt_state = carry
        batch = task.data.batch(key, "train")
        (loss, state), g = jax.value_and_grad(task.loss_with_state, has_aux=True)(params, state, key, batch)
        u, opt_state = tx.update(g, opt_state, params, loss=loss)
        return (optax.apply_updates(params, u), state, opt_state), loss

    keys = jax.random.split(jax.random.key(2), spec.num_steps)
    _, losses = jax.jit(lambda c: jax.lax.scan(step, c, keys))((params, state, tx.init(params)))
    losses = np.asarray(losses)
    assert np.all(np.isfinite(losses))
    assert losses[-5:].mean() < 0.8 * losses[:5].mean(), (losses[:5], losses[-5:])


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    """lopt.pretrained reading a directory that ships RECIPE with a fresh theta of its config."""
    gin.clear_config()
    with open(os.path.join(ROOT, "scripts", "configs", f"pretrained_{RECIPE}.gin"), encoding="utf-8") as f:
        text = f.read()
    try:
        gin.parse_config(text, skip_unknown=True)
        learned_opt = lopt.NormMLPLOpt(**gin.get_bindings("NormMLPLOpt"))
    finally:
        gin.clear_config()
    (tmp_path / "thetas").mkdir()
    staging = tmp_path / "theta.msgpack"
    lopt.save_theta(str(staging), learned_opt, learned_opt.init(jax.random.key(0)))
    digest = hashlib.sha256(staging.read_bytes()).hexdigest()
    staging.rename(tmp_path / "thetas" / f"{digest}.msgpack")
    record = {"name": RECIPE, "architecture": learned_opt.name, "config": learned_opt.config(), "theta_sha256": digest,
              "recipe": f"scripts/configs/pretrained_{RECIPE}.gin",
              "command": f"python scripts/outer_train.py --gin_file scripts/configs/pretrained_{RECIPE}.gin "
                         f"--output_dir RUN_DIR", "git_commit": "test", "meta_training_steps": 0,
              "meta_training_hours": 0.0, "hardware": "test", "results": ["a fresh theta, not meta-trained"],
              "licence": "same licence as lopt"}
    (tmp_path / f"{RECIPE}.json").write_text(json.dumps(record))
    monkeypatch.setattr(lopt.pretrained, "_DIR", str(tmp_path))
    return tmp_path


def test_shipped_theta_files_are_stored_once_by_hash():
    """Each distinct theta is stored once, under its SHA-256, and every stored theta belongs to a record;
    normmlp_v2 and normmlp_v3 are shipped (each record's contract: test_each_shipped_optimizer_meets_the_contract)."""
    here = os.path.dirname(lopt.pretrained.__file__)
    assert not [f for f in os.listdir(here) if f.endswith(".msgpack")], "theta files belong in thetas/"
    stored = sorted(os.listdir(os.path.join(here, lopt.pretrained.THETA_DIR)))
    assert stored == sorted({lopt.pretrained.info(n)["theta_sha256"] + ".msgpack" for n in lopt.pretrained.names()})
    assert {"normmlp_v2", "normmlp_v3"} <= set(lopt.pretrained.names())


# The recommended and the cheap-on-CPU names are checked in the fast tier, every other name in the slow tier.
@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n in (lopt.pretrained.RECOMMENDED, "normmlp_v3")
                                               else (pytest.mark.slow,)) for n in lopt.pretrained.names()])
def test_each_shipped_optimizer_meets_the_contract(name):
    check_shipped(name)


def test_celo2_v5_to_v9_share_one_theta_file():
    paths = {lopt.pretrained.theta_path(f"celo2_v{i}") for i in range(5, 10)}
    assert len(paths) == 1 and os.path.exists(paths.pop())


_FILE_PATH = re.compile(r"(?<![\w./])((?:lopt|tasks|outer_trainers|scripts|docs|tests)/[\w/.-]*\w\.(?:py|gin|md|json))")
_DOTTED = re.compile(r"(?<![\w./])((?:lopt|tasks|outer_trainers)(?:\.\w+)+)")
_SHORT = re.compile(r"(?<![\w./])(\w+)\.(\w+)")


def _resolves(dotted: str) -> bool:
    """Whether `a.b.c` names a module or an attribute of one (the longest importable prefix, then getattr)."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


def _stale_paths(text: str) -> list[str]:
    """The file paths and module paths `text` names that do not exist (files relative to the repository
    root; `lopt.x.y`; `module.name` where module is one of lopt's parts, rules or architectures)."""
    import lopt.archs
    import lopt.parts
    import lopt.rules
    short = {m.name: f"{pkg.__name__}.{m.name}" for pkg in (lopt.parts, lopt.rules, lopt.archs)
             for m in pkgutil.iter_modules(pkg.__path__)}
    stale = [p for p in _FILE_PATH.findall(text) if not os.path.exists(os.path.join(ROOT, p))]
    stale += [d for d in _DOTTED.findall(text) if not _resolves(d)]
    stale += [f"{m}.{a}" for m, a in _SHORT.findall(text) if m in short and not _resolves(f"{short[m]}.{a}")]
    return stale


def test_every_path_a_record_or_recipe_names_resolves():
    """No shipped record or pretrained recipe names a file or module that no longer exists."""
    assert _stale_paths("see lopt/orthogonal/celo2_lopt.py and features.horizon_scale, lopt.rules.nope") == [
        "lopt/orthogonal/celo2_lopt.py", "lopt.rules.nope", "features.horizon_scale"]
    assert _stale_paths("lopt/archs/celo2_lopt.py, lopt.rules.horizon.horizon_scale, horizon.horizon_scale") == []
    texts = {path: open(path, encoding="utf-8").read()
             for path in glob.glob(os.path.join(ROOT, "scripts", "configs", "pretrained_*.gin"))}
    texts.update({f"lopt.pretrained.info({n!r})": json.dumps(lopt.pretrained.info(n)) for n in lopt.pretrained.names()})
    stale = {where: found for where, text in texts.items() if (found := _stale_paths(text))}
    assert not stale, stale


def test_stand_in_meets_the_contract_through_the_api(stand_in):
    assert lopt.pretrained.names() == [RECIPE]
    check_shipped(RECIPE, meta_trained=False)


def test_unknown_name_missing_horizon_and_damaged_file_are_refused(stand_in):
    with pytest.raises(ValueError, match=f"unknown pretrained optimizer 'nope'; known: '{RECIPE}'"):
        lopt.pretrained.load("nope")
    with pytest.raises(ValueError, match="unknown pretrained optimizer"):
        lopt.pretrained.info("nope")
    with pytest.raises(ValueError, match="pass num_steps="):
        lopt.pretrained.load(RECIPE)  # its step-size schedule reads the training progress
    with pytest.raises(ValueError, match="positive int"):
        lopt.pretrained.load(RECIPE, num_steps=0)
    path = lopt.pretrained.theta_path(RECIPE)
    data = bytearray(open(path, "rb").read())
    data[-3] ^= 0xFF
    with open(path, "wb") as f:
        f.write(bytes(data))
    with pytest.raises(ValueError, match="damaged or was replaced"):
        lopt.pretrained.load(RECIPE, num_steps=10)


def test_a_horizon_past_the_meta_training_ones_warns():
    """load warns when num_steps exceeds the longest recorded meta-training horizon, and only then."""
    longest = lopt.pretrained.info("normmlp_v3")["meta_training_horizons"][1]
    with pytest.warns(UserWarning, match=f"meta-trained on horizons of 100-{longest} steps; at num_steps={4 * longest}"):
        lopt.pretrained.load("normmlp_v3", num_steps=4 * longest)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lopt.pretrained.load("normmlp_v3", num_steps=longest)


@pytest.mark.slow
def test_celo2_v4_is_deployed_with_the_horizon_rule_that_leaves_runs_up_to_2000_steps_as_they_were():
    """load("celo2_v4") applies its rule chain's horizon rule: on a run of ≤ 2000 steps every update is
    the meta-trained config's, bit for bit (so the heldout-cpu, lm-cpu and scaling-cpu figures stand);
    on a longer run the steps are smaller."""
    options = {"horizon_reference": 2000, "horizon_power": 1.0, "residual_horizon_power": 2.0}
    assert {"part": "horizon_scaled", "reference": 2000, "power": 1.0, "residual_power": 2.0} in \
        lopt.pretrained.info("celo2_v4")["rules"]
    assert {k: lopt.pretrained.deploy_options("celo2_v4")[k] for k in options} == options  # the chain as fields
    meta_trained, theta = lopt.pretrained.load_learned_optimizer_by_name("celo2_v4")
    assert lopt.pretrained.deployed_learned_optimizer("celo2_v4")[0] == type(meta_trained)(
        **{**meta_trained.config(), **options})
    params = {"w1": jax.random.normal(jax.random.key(0), (8, 16)) * 0.3, "b1": np.zeros(16, np.float32),
              "w2": jax.random.normal(jax.random.key(1), (16, 4)) * 0.3}

    def run(tx, n=3):
        state, p, out = tx.init(params), params, []
        for i in range(n):
            grads = jax.tree_util.tree_map(lambda x: np.cos(3.0 * x + i), p)
            u, state = tx.update(grads, state, p, loss=1.0 / (i + 1))
            p = optax.apply_updates(p, u)
            out.append(u)
        return out

    for n in (600, 2000):
        for a, b in zip(run(lopt.pretrained.load("celo2_v4", num_steps=n)), run(meta_trained.opt_fn(theta, num_steps=n))):
            for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
                np.testing.assert_array_equal(x, y)
    with pytest.warns(UserWarning, match="outside them"):
        long = run(lopt.pretrained.load("celo2_v4", num_steps=20_000), n=1)[0]
    plain = run(meta_trained.opt_fn(theta, num_steps=20_000), n=1)[0]
    assert float(np.linalg.norm(long["w1"])) < 0.2 * float(np.linalg.norm(plain["w1"]))


def test_celo2_v5_is_deployed_with_the_horizon_and_depth_rules():
    """load("celo2_v5") applies its chain (the schedule, horizon and depth parts): on a model of at most 3
    weight matrices and a run of ≤ 2000 steps the update is the meta-trained config's; in a model of 6
    weight matrices every matrix step is 3/6 of it and the other tensors' steps are unchanged."""
    options = {"horizon_reference": 2000, "horizon_power": 1.0, "residual_horizon_power": 2.0,
               "depth_reference": 3, "depth_power": 1.0}
    assert lopt.pretrained.info("celo2_v5")["rules"] == [
        {"part": "scheduled", "name": "cosine"},
        {"part": "horizon_scaled", "reference": 2000, "power": 1.0, "residual_power": 2.0},
        {"part": "depth_scaled", "reference": 3, "power": 1.0}]
    assert lopt.pretrained.deploy_options("celo2_v5") == {"schedule": "cosine", **options}
    meta_trained, theta = lopt.pretrained.load_learned_optimizer_by_name("celo2_v5")
    assert lopt.pretrained.deployed_learned_optimizer("celo2_v5")[0] == type(meta_trained)(
        **{**meta_trained.config(), **options})

    def params(depth):
        keys = jax.random.split(jax.random.key(0), depth)
        return {f"layer_{i}": {"w": jax.random.normal(k, (8, 8)) * 0.3, "b": np.zeros(8, np.float32)}
                for i, k in enumerate(keys)}

    def first_update(tx, p):
        grads = jax.tree_util.tree_map(lambda x: np.cos(3.0 * x), p)
        return tx.update(grads, tx.init(p), p, loss=1.0)[0]

    for depth, factor in ((3, 1.0), (6, 0.5)):
        p = params(depth)
        deployed = first_update(lopt.pretrained.load("celo2_v5", num_steps=1000), p)
        plain = first_update(meta_trained.opt_fn(theta, num_steps=1000), p)
        for name in p:
            np.testing.assert_allclose(deployed[name]["w"], factor * plain[name]["w"], rtol=1e-5, atol=1e-9)
            np.testing.assert_allclose(deployed[name]["b"], plain[name]["b"], rtol=1e-6, atol=1e-12)


def test_celo2_v6_is_celo2_v5s_theta_with_the_loss_aware_weight_decay():
    """celo2_v6 ships celo2_v5's theta file byte for byte and deploys it with celo2_v5's rules plus the
    loss-aware weight-decay rule: λ = 0.03 · clip(ℓ_0 / (10 ℓ̄), 1, 10) on the weight matrices."""
    _check_deployed_as("celo2_v6", "celo2_v5", {"wd_rate": 0.03, "wd_loss_power": 1.0, "wd_loss_free": 10.0,
                                                "wd_loss_max": 10.0})


def _check_deployed_as(name, base, options):
    """NAME ships BASE's theta file byte for byte, deployed with BASE's options plus `options`."""
    assert lopt.pretrained.info(name)["theta_sha256"] == lopt.pretrained.info(base)["theta_sha256"]
    assert lopt.pretrained.deploy_options(name) == {**lopt.pretrained.deploy_options(base), **options}
    base_opt, base_theta = lopt.pretrained.deployed_learned_optimizer(base)
    deployed, theta = lopt.pretrained.deployed_learned_optimizer(name)
    assert deployed == dataclasses.replace(base_opt, **options)
    jax.tree_util.tree_map(np.testing.assert_array_equal, theta, base_theta)


def test_celo2_v7_is_celo2_v6_with_the_no_growth_rule():
    """celo2_v7 ships celo2_v5's theta file byte for byte, deployed as celo2_v6 plus the no-growth rule on
    matrices past 4× LeCun's scale; its update differs from celo2_v6's only where a matrix is past that."""
    _check_deployed_as("celo2_v7", "celo2_v6", {"residual_no_growth": True, "residual_growth_free": 4.0})
    key_small, key_large = jax.random.split(jax.random.key(0))
    small = {"w": jax.random.normal(key_small, (16, 8)) / 4.0}  # rms · √fan_in = 1: the rule does not act
    large = {"w": jax.random.normal(key_large, (16, 8)) * 2.0}  # 8 > 4: it may
    grads = {"w": jnp.cos(jnp.arange(128.0)).reshape(16, 8)}
    for params, same in ((small, True), (large, False)):
        u6, u7 = (lopt.pretrained.load(n, num_steps=100).update(grads, lopt.pretrained.load(n, num_steps=100).init(params),
                                                                 params, loss=1.0)[0]["w"] for n in ("celo2_v6", "celo2_v7"))
        assert np.array_equal(np.asarray(u6), np.asarray(u7)) == same


@pytest.mark.slow  # heavy; the fast tier keeps a smaller check of the same part
def test_celo2_v8_is_celo2_v7_with_the_decay_starting_earlier():
    """celo2_v8 ships celo2_v5's theta file byte for byte, deployed as celo2_v7 with ρ_free = 3: the decay's
    rate λ = 0.03 · clip(ℓ_0 / (3 ℓ̄), 1, 10) grows once the loss is 3× below its start (celo2_v7: 10×)."""
    _check_deployed_as("celo2_v8", "celo2_v7", {"wd_loss_free": 3.0})
    params = {"w": jax.random.normal(jax.random.key(0), (16, 8)) / 4.0}
    grads = {"w": jnp.cos(jnp.arange(128.0)).reshape(16, 8)}

    def update_at(name, loss):
        """The update after a first step at loss 1 and 30 at `loss`: the loss EMA ℓ̄ (decay 0.9) ends
        within 5% of `loss`'s distance from 1 to it, ℓ_0 = 1."""
        tx = lopt.pretrained.load(name, num_steps=100)
        update = jax.jit(tx.update)
        state = update(grads, tx.init(params), params, loss=1.0)[1]
        for _ in range(29):
            state = update(grads, state, params, loss=loss)[1]
        return np.asarray(update(grads, state, params, loss=loss)[0]["w"])

    # ℓ̄ > 1/3: both decay at 0.03; ℓ̄ ≈ 0.23: celo2_v8's rate has grown (ℓ_0 / (3 ℓ̄) ≈ 1.4), celo2_v7's not
    np.testing.assert_array_equal(update_at("celo2_v7", 0.5), update_at("celo2_v8", 0.5))
    assert not np.array_equal(update_at("celo2_v7", 0.2), update_at("celo2_v8", 0.2))


@pytest.mark.slow  # heavy; the fast tier keeps a smaller check of the same part
def test_celo2_v9_is_celo2_v8_with_three_times_the_steps_in_convnets():
    """celo2_v9 ships celo2_v5's theta file byte for byte, deployed as celo2_v8 with conv_step_scale 3: in a
    model with a conv kernel every update is 3× celo2_v8's (the dense head's too); an MLP's is celo2_v8's."""
    _check_deployed_as("celo2_v9", "celo2_v8", {"conv_step_scale": 3.0})
    key_conv, key_dense = jax.random.split(jax.random.key(0))
    convnet = {"Conv_0": {"kernel": jax.random.normal(key_conv, (3, 3, 1, 8)) / 3.0},
               "Dense_0": {"kernel": jax.random.normal(key_dense, (8, 10)) / 3.0, "bias": jnp.zeros(10)}}
    mlp = {"Dense_0": convnet["Dense_0"]}

    def first_update(name, params):
        grads = jax.tree_util.tree_map(lambda p: jnp.cos(jnp.arange(p.size, dtype=jnp.float32)).reshape(p.shape),
                                       params)
        tx = lopt.pretrained.load(name, num_steps=100)
        return tx.update(grads, tx.init(params), params, loss=1.0)[0]

    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(b, 3.0 * a, rtol=1e-6, atol=1e-12),
                           first_update("celo2_v8", convnet), first_update("celo2_v9", convnet))
    jax.tree_util.tree_map(np.testing.assert_array_equal, first_update("celo2_v8", mlp), first_update("celo2_v9", mlp))

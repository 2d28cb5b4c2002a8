"""lopt.published: Celo and Celo-Adam from their authors' weights compute what the authors' code computes.

tests/lopt/data/reference_{celo,celo_adam}.npz are the authors' own loop (amoudgl/celo at the
commit `info` records, on google's learned_optimization, jax float32 on CPU):
`state = opt.init(params, num_steps=N)`, then `state = opt.update(state, grads[t], loss=losses[t])`
for 25 steps, on a tree of two dense layers with biases and a 3x3x2x5 conv kernel, for N = 100
and N = 2000, with the params after every step. Every step here must match them to 1e-5 of each
leaf's scale (max |ours - theirs| <= 1e-5 max |theirs|), jitted and eagerly.
"""
import hashlib
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lopt
import lopt.published
from lopt.parts import learned_scheduler

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
LAYERS = {"conv": ("kernel",), "dense0": ("bias", "kernel"), "dense1": ("bias", "kernel")}
STEPS = 25
RTOL = 1e-5


def reference(name):
    return np.load(os.path.join(DATA, f"reference_{name}.npz"))


def tree(ref, prefix):
    return {layer: {leaf: jnp.asarray(ref[f"{prefix}/{layer}/{leaf}"]) for leaf in leaves}
            for layer, leaves in LAYERS.items()}


def check_against_reference(ref, num_steps, init, update):
    """Runs the 25 reference steps with `init(params)` / `update(grads, state, params, loss)`;
    every leaf after every step within RTOL of its scale. Returns the largest error."""
    params = tree(ref, "params_init")
    state = init(params)
    worst = 0.0
    for t in range(STEPS):
        updates, state = update(tree(ref, f"grads/{t}"), state, params, jnp.float32(ref["losses"][t]))
        params = optax.apply_updates(params, updates)
        want = tree(ref, f"params/{num_steps}/{t}")
        for path, ours in jax.tree_util.tree_flatten_with_path(params)[0]:
            theirs = np.asarray(want[path[0].key][path[1].key])
            err = float(np.max(np.abs(np.asarray(ours) - theirs)) / np.max(np.abs(theirs)))
            assert err <= RTOL, (num_steps, t, jax.tree_util.keystr(path), err)
            worst = max(worst, err)
    assert int(state.iteration) == STEPS
    # the parameters moved by far more than the tolerance, so the match is not vacuous
    start = tree(ref, "params_init")
    moved = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))) / np.max(np.abs(np.asarray(b))))
                for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(start)))
    assert moved > 1000 * RTOL
    return worst


@pytest.mark.parametrize("name", ["celo", "celo_adam"])
def test_every_step_matches_the_authors_loop_jitted(name, compile_counter):
    """One jitted update serves both horizons (N is traced): compiled once, not per step or horizon."""
    ref = reference(name)
    learned_opt, theta = lopt.published.learned_optimizer(name)
    init = jax.jit(lambda n, params: learned_opt.opt_fn(theta, num_steps=n).init(params))
    step = jax.jit(lambda n, grads, state, params, loss:
                   learned_opt.opt_fn(theta, num_steps=n).update(grads, state, params, loss=loss))
    check_against_reference(ref, 100, lambda p: init(100, p), lambda *args: step(100, *args))
    with compile_counter() as counter:
        check_against_reference(ref, 2000, lambda p: init(2000, p), lambda *args: step(2000, *args))
    assert counter.count == 0


@pytest.mark.parametrize("name", ["celo", "celo_adam"])
@pytest.mark.parametrize("num_steps", [100, 2000])
def test_every_step_matches_the_authors_loop_eagerly(name, num_steps):
    """lopt.published.load, its update called without jit."""
    tx = lopt.published.load(name, num_steps=num_steps)
    check_against_reference(reference(name), num_steps, tx.init,
                            lambda grads, state, params, loss: tx.update(grads, state, params, loss=loss))


def test_the_horizon_changes_the_update():
    """N enters through t/N and the loss averages' half-lives: the two references differ, and so do we."""
    ref = reference("celo")
    a, b = ref[f"params/100/{STEPS - 1}/dense0/kernel"], ref[f"params/2000/{STEPS - 1}/dense0/kernel"]
    assert np.max(np.abs(a - b)) > 1e-3


@pytest.mark.parametrize("name", ["celo", "celo_adam"])
def test_info_records_source_licence_and_checksum(name):
    record = lopt.published.info(name)
    assert record["licence"] == "MIT" and record["source_repository"] == "https://github.com/amoudgl/celo"
    assert len(record["source_commit"]) == 40 and "arXiv" in record["paper"]
    with open(lopt.published.theta_path(name), "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == record["theta_sha256"]
    with open(record["licence_path"], encoding="utf-8") as f:
        text = f.read()
    assert text.startswith("MIT License") and record["copyright"] in text
    learned_opt, theta = lopt.published.learned_optimizer(name)
    assert learned_opt.name == record["architecture"]
    fresh = learned_opt.init(jax.random.key(0))  # the same layout as a fresh theta, other values
    assert jax.tree_util.tree_structure(fresh) == jax.tree_util.tree_structure(theta)
    assert not np.allclose(fresh["scheduler"]["embed"]["w"], theta["scheduler"]["embed"]["w"])


def test_names_and_bad_arguments():
    assert lopt.published.names() == ["celo", "celo_adam"]
    with pytest.raises(ValueError, match="unknown published optimizer 'velo'.*'celo'"):
        lopt.published.load("velo", num_steps=10)
    for bad in (None, 0, 2.5, True):
        with pytest.raises(ValueError, match="num_steps must be a positive int"):
            lopt.published.load("celo", num_steps=bad)
    tx = lopt.published.load("celo_adam", num_steps=10)
    params = {"w": jnp.ones((2, 3))}
    with pytest.raises(ValueError, match="reads the training loss"):
        tx.update(params, tx.init(params), params)
    with pytest.raises(ValueError, match="needs params"):
        tx.update(params, tx.init(params), loss=1.0)


def test_a_replaced_theta_file_is_refused(tmp_path, monkeypatch):
    folder = tmp_path / "celo"
    folder.mkdir()
    for f in ("info.json", "LICENSE"):
        folder.joinpath(f).write_bytes(open(os.path.join(os.path.dirname(lopt.published.theta_path("celo")), f),
                                            "rb").read())
    folder.joinpath("theta.state").write_bytes(b"not the authors' file")
    monkeypatch.setattr(lopt.published, "_DIR", str(tmp_path))
    with pytest.raises(ValueError, match="damaged or was replaced"):
        lopt.published.load("celo", num_steps=10)


@pytest.mark.parametrize("cls", [lopt.Celo, lopt.CeloAdam])
def test_the_architectures_train_from_a_fresh_theta_with_any_dtype_and_scalars(cls):
    """A fresh theta (a meta-training starting point) gives finite updates in each parameter's dtype,
    a scalar and a bfloat16 leaf included, and the scheduler's initial multiplier is 0.1."""
    learned_opt = cls()
    tx = learned_opt.opt_fn(learned_opt.init(jax.random.key(0)), num_steps=50)
    params = {"s": jnp.float32(0.5), "b": jnp.ones((7,), jnp.bfloat16), "w": jnp.linspace(-1, 1, 12).reshape(3, 4)}
    state = tx.init(params)
    grads = {"s": jnp.float32(-0.3), "b": jnp.linspace(-1, 2, 7).astype(jnp.bfloat16),
             "w": jnp.cos(jnp.arange(12.0)).reshape(3, 4)}
    updates, state = tx.update(grads, state, params, loss=2.0)
    for u, p in zip(jax.tree_util.tree_leaves(updates), jax.tree_util.tree_leaves(params)):
        assert u.dtype == jnp.result_type(p) and u.shape == jnp.shape(p)
        assert bool(jnp.all(jnp.isfinite(u.astype(jnp.float32)))) and bool(jnp.any(u != 0))
    s, _ = learned_scheduler.step(learned_opt.init(jax.random.key(0))["scheduler"],
                                  learned_scheduler.init_state(learned_opt.init(jax.random.key(0))["scheduler"], 50),
                                  jnp.float32(1.0), jnp.int32(0), 50)
    assert float(s) == pytest.approx(0.1)


def test_loss_features_track_the_loss_history():
    """A falling loss: the short averages sit below the long ones (features < 0 after 2 losses);
    before the third loss every feature is 0."""
    buf = learned_scheduler.init_loss_buffer(100)
    for i, loss in enumerate([5.0, 4.0, 3.0, 2.0, 1.0]):
        buf = learned_scheduler.update_loss_buffer(buf, jnp.float32(loss))
        feats = learned_scheduler.loss_buffer_features(buf)
        if i < 2:
            assert np.all(np.asarray(feats) == 0)
    assert np.all(np.asarray(feats) < 0) and np.all(np.asarray(feats) >= -1)

"""scripts/benchmark_estimators.py: the PES breakdown times the parts it says it times."""
import benchmark_estimators as be
import jax
import numpy as np
import pytest

import lopt
import outer_trainers as ot
import tasks


@pytest.mark.slow
def test_breakdown_parts():
    lo = lopt.MLPLOpt()
    theta = lo.init(jax.random.key(0))
    step = ot.LOptTruncatedStep(tasks.QuadraticFamily(dim=4), lo, ot.ConstantTruncationSchedule(1000))
    fns = be.breakdown_fns(step, theta, num_calls=3)
    assert list(fns) == ["unroll only, θ shared", "unroll only, θ per particle", "perturbation draw (ε, θ ± ε)",
                         "TruncatedPES (all of it)"]
    n, K = be.NUM_TASKS, be.TRUNC
    # both unrolls run the same 2N particles for K steps; with θ broadcast they are the same unroll
    (_, shared), (_, per_particle) = fns["unroll only, θ shared"](), fns["unroll only, θ per particle"]()
    assert shared.loss.shape == (K, 2 * n)
    np.testing.assert_allclose(shared.loss, per_particle.loss, rtol=1e-5)
    # the draw gives [θ + ε; θ − ε]: its two halves average to θ and differ by 2ε of std 0.01
    pm = fns["perturbation draw (ε, θ ± ε)"]()
    for t, x in zip(jax.tree_util.tree_leaves(theta), jax.tree_util.tree_leaves(pm)):
        assert x.shape == (2 * n,) + t.shape
        np.testing.assert_allclose((x[:n] + x[n:]) / 2, np.broadcast_to(t, x[:n].shape), atol=1e-6)
    diffs = np.concatenate([np.ravel(x[:n] - x[n:]) / 2 for x in jax.tree_util.tree_leaves(pm)])
    assert 0.008 < diffs.std() < 0.012
    grad = fns["TruncatedPES (all of it)"]()
    assert jax.tree_util.tree_structure(grad) == jax.tree_util.tree_structure(theta)


def test_floor_trains_each_particle_with_its_own_copy_of_theta():
    """The floor (each particle vmapped with its own copy of θ) gives each particle the mean loss
    of the same training run done alone: task, init and steps from its key, the learned optimizer
    at θ."""
    lo = lopt.MLPLOpt(hidden_size=4)
    theta = lo.init(jax.random.key(0))
    family = tasks.QuadraticFamily(dim=300)  # a 300-parameter vector: MLPLOpt's blocked column-major path
    got = be.floor_fn(family, lo, theta, 2, 3)()
    want = []
    for key in jax.random.split(jax.random.key(0), 2):
        task = family.task_fn(family.sample(key))
        params, ms = task.init_with_state(key)
        tx = lo.opt_fn(theta)
        state, losses = tx.init(params), []
        for k in jax.random.split(key, 3):
            (loss, ms), g = jax.value_and_grad(task.loss_with_state, has_aux=True)(params, ms, k, None)
            upd, state = tx.update(g, state, params, loss=loss)
            params = jax.tree_util.tree_map(lambda p, u: p + u, params, upd)
            losses.append(loss)
        want.append(np.mean(losses))
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert want[0] != want[1]

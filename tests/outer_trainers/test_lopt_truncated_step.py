import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lopt
import outer_trainers as ot
import tasks


@pytest.fixture(scope="module")
def quad_step():
    family = tasks.QuadraticFamily(dim=4)
    return ot.LOptTruncatedStep(family, lopt.LearnableSGD(0.1), ot.ConstantTruncationSchedule(3))


def test_step_matches_manual_sgd(quad_step):
    lo = quad_step.learned_opt
    theta = lo.init(jax.random.key(0))
    state = quad_step.init(theta, jax.random.key(1))
    task = quad_step.task_family.task_fn(state.task_cfg)
    new_state, out = quad_step.step(theta, state, jax.random.key(2))
    g = jax.grad(task.loss)(state.params, None, None)
    expected = jax.tree_util.tree_map(lambda p, gi: p - 0.1 * gi, state.params, g)
    chex.assert_trees_all_close(new_state.params, expected, rtol=1e-6)
    np.testing.assert_allclose(out.loss, task.loss(state.params, None, None), rtol=1e-6)
    assert int(new_state.inner_step) == 1 and not bool(out.is_done)


def test_resets_after_episode_length(quad_step):
    theta = quad_step.learned_opt.init(jax.random.key(0))
    state = quad_step.init(theta, jax.random.key(1))
    dones = []
    for i in range(7):
        state, out = quad_step.step(theta, state, jax.random.key(10 + i))
        dones.append(bool(out.is_done))
    assert dones == [False, False, True, False, False, True, False]
    assert int(state.inner_step) == 1


def test_initial_offset_shortens_first_episode(quad_step):
    theta = quad_step.learned_opt.init(jax.random.key(0))
    state = quad_step.init(theta, jax.random.key(1), initial_offset=2)
    _, out = quad_step.step(theta, state, jax.random.key(2))
    assert bool(out.is_done)


def test_nonfinite_loss_resets_and_is_masked():
    family = tasks.QuadraticFamily(dim=4)
    # lr = 1e30 blows the quadratic up within a couple of steps
    step = ot.LOptTruncatedStep(family, lopt.LearnableSGD(1e30), ot.ConstantTruncationSchedule(100))
    theta = step.learned_opt.init(jax.random.key(0))
    state = step.init(theta, jax.random.key(1))
    seen_bad = False
    for i in range(4):
        state, out = step.step(theta, state, jax.random.key(i))
        assert np.isfinite(out.loss)
        if not bool(out.mask):
            seen_bad = True
            assert bool(out.is_done) and int(out.metrics["nonfinite"]) == 1
            assert int(state.inner_step) == 0
            chex.assert_tree_all_finite(state.params)
    assert seen_bad


def test_meta_loss_split_uses_validation_data():
    family = tasks.ImageMLPFamily("digits", (8,), batch_size=16)
    step = ot.LOptTruncatedStep(family, lopt.LearnableAdam(), ot.ConstantTruncationSchedule(10),
                                meta_loss_split="outer_valid")
    theta = step.learned_opt.init(jax.random.key(0))
    state = step.init(theta, jax.random.key(1), data=family.data)
    _, out = jax.jit(lambda th, s, k, d: step.step(th, s, k, data=d))(theta, state, jax.random.key(2), family.data)
    assert np.isfinite(out.loss) and 0.5 < float(out.loss) < 1.6


def test_meta_loss_split_requires_data():
    with pytest.raises(ValueError, match="meta_loss_split"):
        ot.LOptTruncatedStep(tasks.QuadraticFamily(2), lopt.LearnableSGD(), ot.ConstantTruncationSchedule(2),
                             meta_loss_split="outer_valid")


def test_type_errors_name_the_argument():
    with pytest.raises(TypeError, match="learned_opt"):
        ot.LOptTruncatedStep(tasks.QuadraticFamily(2), optax.adam(1e-3), ot.ConstantTruncationSchedule(2))
    with pytest.raises(TypeError, match="trunc_sched"):
        ot.LOptTruncatedStep(tasks.QuadraticFamily(2), lopt.LearnableSGD(), 10)


def test_batched_step_equals_vmapped_step_across_resets():
    """The lax.cond reset path of batched_step gives exactly vmap(step), resets included."""
    from outer_trainers.truncated_step import TruncatedStep

    family = tasks.QuadraticFamily(dim=3)
    step = ot.LOptTruncatedStep(family, lopt.MLPLOpt(hidden_size=4), ot.LogUniformTruncationSchedule(2, 5))
    theta = step.learned_opt.init(jax.random.key(0))
    thetas = jax.tree_util.tree_map(lambda t: jnp.stack([t, t * 1.01, t * 0.99, t]), theta)
    states = jax.vmap(lambda k: step.init(theta, k))(jax.random.split(jax.random.key(1), 4))

    def run(fn):
        def body(s, k):
            return fn(thetas, s, jax.random.split(k, 4))
        return jax.jit(lambda s: jax.lax.scan(body, s, jax.random.split(jax.random.key(2), 12)))(states)

    fast = run(step.batched_step)
    plain = run(lambda th, s, k: TruncatedStep.batched_step(step, th, s, k))
    assert int(jnp.sum(fast[1].is_done)) >= 4  # several resets happened
    chex.assert_trees_all_equal(fast, plain)

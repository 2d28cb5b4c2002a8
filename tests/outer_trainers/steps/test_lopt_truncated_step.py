"""LOptTruncatedStep: one step is one optax update; episodes, offsets, resets and non-finite steps;
batched_step equals vmap(step), and a reset group (a ± pair) ends its episodes together."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lopt
import outer_trainers as ot
import tasks
from tests.fixtures import lopt_step


@pytest.fixture(scope="module")
def quad_step():
    return lopt_step(4, lopt.LearnableSGD(0.1), 3)


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


def test_init_particles_staggers_first_episodes(quad_step):
    """unroll.init_particles with max_offset = 2: offsets uniform in {0, 1, 2} (three-step episodes)."""
    from outer_trainers.steps import unroll as U
    theta = quad_step.learned_opt.init(jax.random.key(0))
    states = U.init_particles(quad_step, theta, jax.random.key(1), 64, max_offset=2)
    assert set(np.asarray(states.inner_step).tolist()) == {0, 1, 2}
    np.testing.assert_array_equal(U.init_particles(quad_step, theta, jax.random.key(1), 4).inner_step, 0)


@pytest.mark.parametrize("sched,expected", [(ot.ConstantTruncationSchedule(3), 3),
                                            (ot.LogUniformTruncationSchedule(2, 9), 9),
                                            (ot.NeverEndingTruncationSchedule(), None)])
def test_max_episode_length_is_the_schedules_max_length(sched, expected):
    step = lopt_step(2, lopt.LearnableSGD(0.1), sched)
    assert step.max_episode_length == expected


def test_nonfinite_loss_resets_and_is_masked():
    # lr = 1e30 blows the quadratic up within a couple of steps
    step = lopt_step(4, lopt.LearnableSGD(1e30), 100)
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
    step = lopt_step(family, lopt.LearnableAdam(), 10, meta_loss_split="outer_valid")
    theta = step.learned_opt.init(jax.random.key(0))
    state = step.init(theta, jax.random.key(1), data=family.data)
    _, out = jax.jit(lambda th, s, k, d: step.step(th, s, k, data=d))(theta, state, jax.random.key(2), family.data)
    assert np.isfinite(out.loss) and 0.5 < float(out.loss) < 1.6


def test_meta_loss_end_power_weighs_each_step_by_its_place_in_the_episode():
    """With p = 2 and episodes of 4 steps, step t's meta-loss is 3 (t / 4)^2 times the unweighted one,
    t = 1, 2, 3, 4 and again from 1 after the reset (whose fresh task both steps draw alike); the
    training itself (params, resets) is unchanged, and the weights' mean over an episode is near 1."""
    plain, weighted = lopt_step(4, lopt.LearnableSGD(0.1), 4), lopt_step(4, lopt.LearnableSGD(0.1), 4,
                                                                       meta_loss_end_power=2)
    theta = plain.learned_opt.init(jax.random.key(0))
    s_plain = s_weighted = plain.init(theta, jax.random.key(1))
    ratios = []
    for i in range(6):
        s_plain, out_plain = plain.step(theta, s_plain, jax.random.key(10 + i))
        s_weighted, out_weighted = weighted.step(theta, s_weighted, jax.random.key(10 + i))
        chex.assert_trees_all_equal(s_weighted.params, s_plain.params)
        assert bool(out_weighted.is_done) == bool(out_plain.is_done)
        ratios.append(float(out_weighted.loss) / float(out_plain.loss))
    t = np.array([1, 2, 3, 4, 1, 2])
    np.testing.assert_allclose(ratios, 3 * (t / 4) ** 2, rtol=1e-6)
    assert abs(np.mean(3 * (np.arange(1, 5) / 4) ** 2) - 1) < 0.5


@pytest.mark.parametrize("bad", [-1.0, float("inf"), float("nan"), "3"])
def test_meta_loss_end_power_must_be_a_finite_number_at_least_zero(bad):
    with pytest.raises(ValueError, match="meta_loss_end_power must be a finite number >= 0"):
        lopt_step(2, lopt.LearnableSGD(), 3, meta_loss_end_power=bad)


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
    family = tasks.QuadraticFamily(dim=3)
    step = lopt_step(family, lopt.MLPLOpt(hidden_size=4), ot.LogUniformTruncationSchedule(2, 5))
    theta = step.learned_opt.init(jax.random.key(0))
    thetas = jax.tree_util.tree_map(lambda t: jnp.stack([t, t * 1.01, t * 0.99, t]), theta)
    states = jax.vmap(lambda k: step.init(theta, k))(jax.random.split(jax.random.key(1), 4))

    def run(fn):
        def body(s, k):
            return fn(thetas, s, jax.random.split(k, 4))
        return jax.jit(lambda s: jax.lax.scan(body, s, jax.random.split(jax.random.key(2), 12)))(states)

    fast = run(step.batched_step)
    plain = run(jax.vmap(step.step))
    assert int(jnp.sum(fast[1].is_done)) >= 4  # several resets happened
    chex.assert_trees_all_equal(fast, plain)


class _PlainStep(ot.TruncatedStep):
    """Delegates init/step to a LOptTruncatedStep but keeps the base class's batched_step."""

    def __init__(self, inner):
        self.inner = inner

    def init(self, theta, key, *, outer_state=None, data=None, initial_offset=0):
        return self.inner.init(theta, key, outer_state=outer_state, data=data, initial_offset=initial_offset)

    def step(self, theta, state, key, *, outer_state=None, data=None):
        return self.inner.step(theta, state, key, outer_state=outer_state, data=data)


@pytest.mark.parametrize("plain", [False, True], ids=["LOptTruncatedStep", "base batched_step"])
def test_one_sided_nonfinite_ends_the_whole_pair(plain):
    """The + half diverges (lr 1e30), the − half does not: with reset_groups=2 both restart together
    on the same fresh task, so the pair's later loss differences compare the same task."""
    step = lopt_step(4, lopt.LearnableSGD(0.01), 100)
    ts = _PlainStep(step) if plain else step
    thetas = {"log_lr": jnp.log(jnp.array([1e30, 1e-2], jnp.float32))}
    particle = ts.init({"log_lr": thetas["log_lr"][1]}, jax.random.key(0))
    states = jax.tree_util.tree_map(lambda x: jnp.stack([x, x]), particle)  # the pair starts on one task

    def run(reset_groups):
        def body(s, k):  # both halves get the same step key, as a ± pair does
            return ts.batched_step(thetas, s, jnp.stack([k, k]), reset_groups=reset_groups)
        return jax.jit(lambda s: jax.lax.scan(body, s, jax.random.split(jax.random.key(1), 6)))(states)

    final, out = run(2)
    bad = np.flatnonzero(~np.asarray(out.mask[:, 0]))
    assert bad.size and np.all(np.asarray(out.mask[:, 1]))  # only the + half went non-finite
    # both halves end their episodes on every step where the + half went non-finite (it does again
    # on each fresh task), so they are at the same position of the same task throughout
    np.testing.assert_array_equal(np.asarray(out.is_done[:, 0]), np.asarray(out.is_done[:, 1]))
    assert np.all(np.asarray(out.is_done[bad, 1]))
    np.testing.assert_array_equal(np.asarray(final.inner_step), [6 - (int(bad[-1]) + 1)] * 2)
    chex.assert_trees_all_close(final.task_cfg["center"][0], final.task_cfg["center"][1])
    # without the grouping the − half runs on in its old episode
    final1, _ = run(1)
    assert int(final1.inner_step[1]) == 6

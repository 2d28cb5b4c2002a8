import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lopt
import outer_trainers as ot
from outer_trainers.learner.gradient_learner import PER_ESTIMATE


@pytest.fixture(scope="module")
def learner():
    return ot.GradientLearner(lopt.LearnableAdam(), optax.sgd(1.0))


def _est(theta, value, loss=1.0):
    return ot.Estimate(grad=jax.tree_util.tree_map(lambda t: jnp.full_like(t, value), theta),
                       loss=jnp.asarray(loss, jnp.float32))


def test_weighted_average_of_estimates(learner):
    state = learner.init(jax.random.key(0))
    new, m = learner.update(state, [_est(state.theta, 1.0), _est(state.theta, 4.0)], weights=[3.0, 1.0])
    # sgd(1.0): theta - (3*1 + 1*4)/4
    chex.assert_trees_all_close(new.theta, jax.tree_util.tree_map(lambda t: t - 1.75, state.theta), rtol=1e-6)
    assert int(m["num_dropped"]) == 0 and int(new.step) == 1


def test_nonfinite_estimates_dropped_and_counted(learner):
    state = learner.init(jax.random.key(0))
    new, m = learner.update(state, [_est(state.theta, 2.0), _est(state.theta, np.nan), _est(state.theta, 1.0, np.inf)])
    chex.assert_trees_all_close(new.theta, jax.tree_util.tree_map(lambda t: t - 2.0, state.theta), rtol=1e-6)
    assert int(m["num_dropped"]) == 2
    assert np.isfinite(float(m["meta_loss"]))


def test_all_dropped_leaves_theta_unchanged(learner):
    state = learner.init(jax.random.key(0))
    new, m = learner.update(state, [_est(state.theta, np.nan)])
    chex.assert_trees_all_equal(new.theta, state.theta)
    assert int(new.step) == 0 and int(m["num_dropped"]) == 1
    assert np.isnan(float(m["meta_loss"]))  # no meta-loss, rather than a reassuring 0


def test_per_estimate_metrics_are_one_dict_per_estimate(learner):
    state = learner.init(jax.random.key(0))
    est = ot.Estimate(grad=jax.tree_util.tree_map(jnp.zeros_like, state.theta), loss=jnp.asarray(np.nan, jnp.float32),
                      metrics={"resets": jnp.asarray(3, jnp.int32)})
    _, m = learner.update(state, [_est(state.theta, 1.0, loss=2.0), est])
    per = m[PER_ESTIMATE]
    assert isinstance(per, tuple) and len(per) == 2
    assert set(per[0]) == {"meta_loss", "dropped"} and set(per[1]) == {"meta_loss", "dropped", "resets"}
    assert float(per[0]["meta_loss"]) == 2.0 and np.isnan(float(per[1]["meta_loss"])) and int(per[1]["resets"]) == 3
    assert [int(p["dropped"]) for p in per] == [0, 1]
    assert float(m["meta_loss"]) == 2.0  # the dropped estimate's loss is not averaged in


def test_update_compiles_once(learner, compile_counter):
    state = learner.init(jax.random.key(0))
    state, _ = learner.update(state, [_est(state.theta, 1.0)])
    with compile_counter() as c:
        learner.update(state, [_est(state.theta, 0.5)])
    assert c.count == 0


def test_bad_weights(learner):
    state = learner.init(jax.random.key(0))
    with pytest.raises(ValueError, match="weights"):
        learner.update(state, [_est(state.theta, 1.0)], weights=[1.0, 2.0])


@pytest.mark.parametrize("weights,match", [([1.0, -1.0], r"weights\[1\] = -1.0"),
                                           ([np.nan, 1.0], r"weights\[0\] = nan"),
                                           ([1.0, np.inf], r"weights\[1\] = inf"),
                                           ([0.0, 0.0], "all estimator weights are 0")])
def test_negative_nonfinite_or_all_zero_weights_are_refused(learner, weights, match):
    state = learner.init(jax.random.key(0))
    with pytest.raises(ValueError, match=match):
        learner.update(state, [_est(state.theta, 1.0), _est(state.theta, 2.0)], weights=weights)


def _counted(theta, value, num_valid, num_steps=8):
    est = _est(theta, value)
    return est.replace(num_valid=jnp.asarray(num_valid, jnp.int32), num_steps=jnp.asarray(num_steps, jnp.int32))


def test_estimate_without_a_valid_step_is_dropped_and_adam_state_untouched():
    """An all-masked estimate (finite zero gradient, 0 valid steps) must not move theta on Adam's momentum."""
    learner = ot.GradientLearner(lopt.LearnableAdam(), optax.adam(0.1))
    state = learner.init(jax.random.key(0))
    state, _ = learner.update(state, [_counted(state.theta, 1.0, 8)])  # momentum is now non-zero
    new, m = learner.update(state, [_counted(state.theta, 0.0, 0)])
    chex.assert_trees_all_equal(new.theta, state.theta)
    chex.assert_trees_all_equal(new.opt_state, state.opt_state)
    assert int(new.step) == 1 and int(m["num_dropped"]) == 1
    assert int(m[PER_ESTIMATE][0]["dropped"]) == 1 and float(m[PER_ESTIMATE][0]["nonfinite_frac"]) == 1.0


def test_partly_valid_estimates_are_applied_and_their_nonfinite_fraction_reported(learner):
    state = learner.init(jax.random.key(0))
    new, m = learner.update(state, [_counted(state.theta, 2.0, 6), _counted(state.theta, 5.0, 0)])
    chex.assert_trees_all_close(new.theta, jax.tree_util.tree_map(lambda t: t - 2.0, state.theta), rtol=1e-6)
    assert int(m["num_dropped"]) == 1 and int(new.step) == 1
    assert [float(p["nonfinite_frac"]) for p in m[PER_ESTIMATE]] == [0.25, 1.0]
    assert float(m["nonfinite_frac"]) == pytest.approx(10 / 16)


def test_theta_init_of_the_wrong_structure_is_refused_when_the_learner_is_built():
    lo = lopt.LearnableAdam()
    good = lo.init(jax.random.key(0))
    ot.GradientLearner(lo, optax.adam(0.1), theta_init=jax.tree_util.tree_map(np.asarray, good))  # numpy is fine
    missing = {k: v for k, v in good.items() if k != "log_lr"}
    with pytest.raises(ValueError, match=r"GradientLearner\(theta_init=...\).*missing leaf \['log_lr'\]"):
        ot.GradientLearner(lo, optax.adam(0.1), theta_init=missing)
    with pytest.raises(ValueError, match=r"unexpected leaf \['extra'\]"):
        ot.GradientLearner(lo, optax.adam(0.1), theta_init=dict(good, extra=jnp.zeros(())))
    with pytest.raises(ValueError, match=r"leaf \['logit_b1'\] has shape \(3,\), but \(\)"):
        ot.GradientLearner(lo, optax.adam(0.1), theta_init=dict(good, logit_b1=jnp.zeros(3)))
    with pytest.raises(ValueError, match=r"leaf \['log_eps'\] has dtype int32, but float32"):
        ot.GradientLearner(lo, optax.adam(0.1), theta_init=dict(good, log_eps=jnp.zeros((), jnp.int32)))

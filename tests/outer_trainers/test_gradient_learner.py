import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lopt
import outer_trainers as ot
from outer_trainers.gradient_learner import PER_ESTIMATE


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


def test_per_estimate_metrics_are_one_dict_per_estimate(learner):
    state = learner.init(jax.random.key(0))
    est = ot.Estimate(grad=jax.tree_util.tree_map(jnp.zeros_like, state.theta), loss=jnp.asarray(np.nan, jnp.float32),
                      metrics={"resets": jnp.asarray(3, jnp.int32)})
    _, m = learner.update(state, [_est(state.theta, 1.0, loss=2.0), est])
    per = m[PER_ESTIMATE]
    assert isinstance(per, tuple) and len(per) == 2
    assert set(per[0]) == {"meta_loss"} and set(per[1]) == {"meta_loss", "resets"}
    assert float(per[0]["meta_loss"]) == 2.0 and np.isnan(float(per[1]["meta_loss"])) and int(per[1]["resets"]) == 3
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

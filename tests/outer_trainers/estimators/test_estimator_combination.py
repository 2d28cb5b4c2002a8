"""Several estimators in one outer step: weighted average in GradientLearner and outer_train."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lopt
import outer_trainers as ot
from tasks.quadratics import QuadraticFamily
from tests.fixtures import lopt_step


def test_learner_combines_estimates_with_weights():
    learned = lopt.LearnableSGD(0.1)
    learner = ot.GradientLearner(learned, optax.sgd(1.0))
    state = learner.init(jax.random.key(0))
    e1 = ot.Estimate({"log_lr": jnp.asarray(1.0)}, jnp.asarray(0.5))
    e2 = ot.Estimate({"log_lr": jnp.asarray(4.0)}, jnp.asarray(1.5))
    new, m = learner.update(state, [e1, e2], weights=[3.0, 1.0])
    # Σ w g / Σ w = (3·1 + 1·4) / 4 = 1.75; SGD at 1.0
    np.testing.assert_allclose(float(new.theta["log_lr"]), float(state.theta["log_lr"]) - 1.75, rtol=1e-6)
    np.testing.assert_allclose(float(m["meta_loss"]), (3 * 0.5 + 1.5) / 4, rtol=1e-6)


@pytest.mark.slow
def test_outer_train_with_pes_on_two_task_families():
    learned = lopt.LearnableSGDM(0.05, 0.5)
    sched = ot.ConstantTruncationSchedule(6)
    ests = [ot.TruncatedPES(lopt_step(QuadraticFamily(2), learned, sched), 4, 3),
            ot.NoiseReuseES(lopt_step(QuadraticFamily(3, noise_std=0.1), learned, sched), 4, 3)]
    seen = []
    state = ot.outer_train(ot.GradientLearner(learned, optax.adam(1e-2)), ests, 3, weights=[1.0, 2.0],
                           reporting=ot.Reporting(progress=False), callback=lambda i, s, m: seen.append(m))
    assert state.step == 3 and len(seen) == 3
    per_estimator = [k for k in seen[-1] if k.startswith("meta_loss/")]
    assert len(per_estimator) == 2, sorted(seen[-1])
    assert all(np.isfinite(m[k]) for m in seen for k in per_estimator)
    assert all(m["num_dropped"] == 0 for m in seen)

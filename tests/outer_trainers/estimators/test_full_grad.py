"""FullGrad: the meta-loss stops at each particle's first episode end (the rest: test_estimator_contract)."""
import jax
import numpy as np

import outer_trainers as ot
from tests.outer_trainers.estimators import estimator_checks as C


def test_steps_after_the_first_episode_are_ignored():
    """Unrolling past the 7-step episode gives the 7-step gradient and loss; each particle ends once."""
    ts, theta = C.quadratic_step(), C.theta0()
    _, exact = ot.FullGrad(ts, 2, C.EPISODE).estimate(theta, None, jax.random.key(1))
    _, longer = ot.FullGrad(ts, 2, C.EPISODE + 5).estimate(theta, None, jax.random.key(1))
    np.testing.assert_allclose(C.flat(longer.grad), C.flat(exact.grad), rtol=1e-6)
    np.testing.assert_allclose(float(longer.loss), float(exact.loss), rtol=1e-6)
    assert int(longer.metrics["resets"]) == 2 and int(exact.metrics["resets"]) == 2

"""GradientEstimator's compile options: they apply to calls from Python; inside a JAX trace (jit,
eval_shape, grad, vmap, scan) the caller's compilation decides, and the estimate is the same."""
import chex
import jax

import outer_trainers as ot
from tests.outer_trainers.estimators import estimator_checks as C

OPTIONS = {"xla_backend_optimization_level": 1}


def test_estimator_with_options_runs_inside_jit_and_eval_shape_with_the_same_estimate():
    est = ot.TruncatedPES(C.quadratic_step(), 2, C.TRUNC, std=0.01, num_devices=1, compiler_options=OPTIONS)
    theta = C.theta0()
    state = est.init_state(theta, jax.random.key(0))
    top = est.estimate(theta, state, jax.random.key(1))
    # JAX refuses compiler options on a jit nested in a trace: the estimator leaves them to the caller
    nested = jax.jit(lambda th, s, k: est.estimate(th, s, k))(theta, state, jax.random.key(1))
    chex.assert_trees_all_close(nested, top, rtol=1e-5, atol=1e-7)
    shapes = jax.eval_shape(lambda th, k: est.init_state(th, k), theta, jax.random.key(0))
    chex.assert_trees_all_equal_shapes_and_dtypes(shapes, state)


def test_options_are_the_estimators_own_copy():
    options = dict(OPTIONS)
    est = ot.TruncatedES(C.quadratic_step(), 2, C.TRUNC, compiler_options=options)
    options["xla_backend_optimization_level"] = 3
    assert est.compiler_options == OPTIONS
    assert ot.TruncatedES(C.quadratic_step(), 2, C.TRUNC, compiler_options={}).compiler_options == {}

"""Divergence that looks like success: an outer step whose estimates rest on no valid inner step
applies nothing (theta and the outer optimizer's state stay bit for bit), is reported (warning,
metrics.jsonl), and `max_consecutive_dropped` such steps in a row stop the run with
MetaTrainingDiverged, also across a resume."""
import os

import chex
import jax
import jax.numpy as jnp
import optax
import pytest

import lopt
import outer_trainers as ot
from outer_trainers.runs.reporting import MetaTrainingDiverged
from tests.fixtures import lopt_step, metrics_lines
from tests.outer_trainers.estimators import estimator_checks as C

LABEL = "TruncatedPES/nan_quadratic"
LEARNED = lopt.LearnableSGDM(0.1, 0.5)


@pytest.fixture(scope="module")
def nan_pes():
    """PES on a family whose every task has a NaN loss: every inner step is masked out."""
    step = lopt_step(C.NaNQuadraticFamily(p_bad=1.0), LEARNED, 6)
    return ot.TruncatedPES(step, num_tasks=2, trunc_length=3, std=0.01)


@pytest.fixture(scope="module")
def good_pes():
    step = lopt_step(2, LEARNED, 6)
    return ot.TruncatedPES(step, num_tasks=2, trunc_length=3, std=0.01)


def test_all_nan_estimates_are_dropped_and_theta_and_adam_state_stay(nan_pes, tmp_path):
    learner = ot.GradientLearner(LEARNED, optax.adam(0.1))
    state = ot.init_outer_state(learner, [nan_pes], jax.random.key(0))
    ones = jax.tree_util.tree_map(jnp.ones_like, state.theta)
    moved, _ = learner.update(state.learner_state, [ot.Estimate(ones, jnp.asarray(1.0))])  # Adam has momentum now
    state = state.replace(learner_state=moved)
    with pytest.warns(RuntimeWarning, match=rf"no valid inner step .*{LABEL} \(100.0% of its inner steps non-finite"):
        out = ot.outer_train(learner, [nan_pes], 3, state=state, output_dir=str(tmp_path),
                             reporting=ot.Reporting(progress=False, tensorboard=False, max_consecutive_dropped=None))
    chex.assert_trees_all_equal(out.learner_state.theta, moved.theta)
    chex.assert_trees_all_equal(out.learner_state.opt_state, moved.opt_state)
    assert int(out.learner_state.step) == 1 and out.step == 3
    lines = metrics_lines(tmp_path)
    assert [line["num_dropped"] for line in lines] == [1, 1, 1]
    assert [line["num_dropped_total"] for line in lines] == [1, 2, 3]
    assert all(line[f"dropped/{LABEL}"] == 1 and line[f"nonfinite_frac/{LABEL}"] == 1.0 and
               line["nonfinite_frac"] == 1.0 for line in lines)


def test_a_step_with_one_valid_estimate_applies_it_and_does_not_count_towards_divergence(nan_pes, good_pes):
    learner = ot.GradientLearner(LEARNED, optax.adam(0.1))
    seen = []
    with pytest.warns(RuntimeWarning, match="1 of 2 estimates"):
        out = ot.outer_train(learner, [nan_pes, good_pes], 3,
                             reporting=ot.Reporting(progress=False, max_consecutive_dropped=1),
                             callback=lambda i, s, m: seen.append(m))
    assert int(out.learner_state.step) == 3
    assert [m["num_dropped"] for m in seen] == [1, 1, 1]
    assert all(m["nonfinite_frac/TruncatedPES/quadratic_dim2"] == 0.0 and m["nonfinite_frac"] == 0.5 for m in seen)


def test_consecutive_dropped_steps_stop_the_run_and_the_count_survives_a_resume(nan_pes, tmp_path):
    learner = ot.GradientLearner(LEARNED, optax.adam(0.1))
    out = str(tmp_path)
    policy = ot.CheckpointPolicy(every_steps=1, every_seconds=None, keep=10)
    run = lambda n: ot.outer_train(learner, [nan_pes], n, output_dir=out,
                                   reporting=ot.Reporting(progress=False, tensorboard=False, max_consecutive_dropped=3),
                                   checkpoint_policy=policy)
    with pytest.warns(RuntimeWarning):
        assert run(2).step == 2  # two steps that applied nothing: below the limit
    with pytest.raises(MetaTrainingDiverged, match=rf"the 3 outer steps 1-3 .*{LABEL} \(100.0% of its inner steps "
                                                   rf"non-finite\).*max_consecutive_dropped=None") as info:
        run(10)  # resumes at step 2 with the count of 2: the first new step is the third in a row
    assert (info.value.step, info.value.since) == (3, 1) and info.value.estimators == {LABEL: 1.0}
    assert [line["step"] for line in metrics_lines(out)] == [1, 2, 3]  # the last step was reported before the error
    written = {step for step, _ in ot.CheckpointManager(os.path.join(out, "checkpoints")).all()}
    assert written == {1, 2}  # what was written stays; the step that stopped the run is not saved


def test_outer_train_refuses_bad_weights_and_limits_before_anything_is_written(good_pes, tmp_path):
    learner = ot.GradientLearner(LEARNED, optax.adam(0.1))
    for kwargs, match in [({"weights": [-1.0]}, r"weights\[0\] = -1.0"), ({"weights": [0.0]}, "all estimator weights"),
                          ({"weights": [float("nan")]}, r"weights\[0\] = nan"),
                          ({"max_consecutive_dropped": 2.5}, "max_consecutive_dropped must be a whole number"),
                          ({"max_consecutive_dropped": 0}, "max_consecutive_dropped must be >= 1")]:
        limits = {k: kwargs.pop(k) for k in list(kwargs) if k == "max_consecutive_dropped"}
        with pytest.raises(ValueError, match=match):
            ot.outer_train(learner, [good_pes], 2, output_dir=str(tmp_path / "run"),
                           reporting=ot.Reporting(progress=False, **limits), **kwargs)
    assert not os.path.exists(tmp_path / "run")

"""Re-sampling estimators every N outer steps (e.g. new task families), with exact resume."""
import chex
import optax
import pytest

import lopt
import outer_trainers as ot
import tasks
from tasks.families import sample_family_for_period
from tests.fixtures import lopt_step


def _make(period):
    """Period k trains quadratics of dimension 2 + k: a static change that needs new estimators."""
    step = lopt_step(2 + period, lopt.LearnableSGD(0.05), 6)
    return [ot.TruncatedPES(step, num_tasks=2, trunc_length=3, std=0.05)]


@pytest.fixture(scope="module")
def learner():
    return ot.GradientLearner(lopt.LearnableSGD(0.05), optax.adam(0.05))


def test_schedule_swaps_estimators_every_period(learner):
    seen = []
    state = ot.outer_train(learner, ot.EstimatorSchedule(2, _make), num_steps=5, reporting=ot.Reporting(progress=False),
                           callback=lambda step, st, m: seen.append(
                               st.estimator_states[0].inner_state.params["x"].shape[-1]))
    # steps 1-2 on dim 2, 3-4 on dim 3, 5 on dim 4
    assert seen == [2, 2, 3, 3, 4]
    assert state.step == 5


@pytest.mark.slow
def test_schedule_resume_matches_a_straight_run(learner, tmp_path):
    policy = ot.CheckpointPolicy(every_steps=1, every_seconds=None)
    straight = ot.outer_train(learner, ot.EstimatorSchedule(2, _make), num_steps=5,
                              reporting=ot.Reporting(progress=False))
    out = str(tmp_path / "run")
    ot.outer_train(learner, ot.EstimatorSchedule(2, _make), num_steps=4, output_dir=out,
                   reporting=ot.Reporting(progress=False, tensorboard=False),
                   checkpoint_policy=policy)
    resumed = ot.outer_train(learner, ot.EstimatorSchedule(2, _make), num_steps=5, output_dir=out,
                             reporting=ot.Reporting(progress=False, tensorboard=False),
                             checkpoint_policy=policy)
    assert resumed.step == 5
    chex.assert_trees_all_equal(resumed.theta, straight.theta)


def test_make_must_return_estimators():
    with pytest.raises(TypeError, match="GradientEstimators"):
        ot.EstimatorSchedule(3, lambda k: [])(0)
    with pytest.raises(ValueError, match="every"):
        ot.EstimatorSchedule(0, _make)


def test_schedule_periods_and_cache():
    made = []
    sched = ot.EstimatorSchedule(3, lambda k: made.append(k) or _make(k))
    assert [sched.period(i) for i in range(7)] == [0, 0, 0, 1, 1, 1, 2]
    assert [sched.resamples_at(i) for i in range(7)] == [False, False, False, True, False, False, True]
    first = sched(0)
    assert sched(2) is first and sched(3) is not first and made == [0, 1]  # built once per period
    # a state after s steps holds the estimators of step s - 1 (of step 0 before the first step)
    assert sched.estimators_of_state(0) is sched(0) and sched.estimators_of_state(3) is sched(2)
    assert sched.estimators_of_state(4)[0].truncated_step.task_family.dim == 3


def test_sampled_families_feed_an_estimator_schedule():
    """tasks.families.sample_family_for_period (host-sampled static configs) plugs into EstimatorSchedule."""
    sampler = lambda rng: tasks.QuadraticFamily(dim=int(rng.integers(2, 5)))
    sched = ot.EstimatorSchedule(1, lambda k: [ot.TruncatedES(
        lopt_step(sample_family_for_period(0, k, sampler), lopt.LearnableSGD(0.05), 4), 2, 2, std=0.05)])
    assert sched(3)[0].truncated_step.task_family.name == sample_family_for_period(0, 3, sampler).name

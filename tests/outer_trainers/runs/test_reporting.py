"""Reporting without a loop: estimator labels, per-estimate metric names, the Reporter's logging,
dropped-estimate counting and run totals."""

import jax.numpy as jnp
import pytest

import lopt
import outer_trainers as ot
import tasks
from outer_trainers.examples.influence_balancing import InfluenceBalancing
from outer_trainers.learner.gradient_learner import PER_ESTIMATE
from outer_trainers.learner.run_records import estimator_labels
from outer_trainers.runs.reporting import MetaTrainingDiverged, Reporter, RunTotals, name_metrics
from tests.fixtures import metrics_lines


def _pes(dim):
    step = ot.LOptTruncatedStep(tasks.QuadraticFamily(dim=dim), lopt.LearnableSGD(0.1),
                                ot.ConstantTruncationSchedule(4))
    return ot.TruncatedPES(step, num_tasks=1, trunc_length=2)


def _metrics(num_dropped=0, losses=(1.0,), dropped=None, fracs=None):
    """A learner's metrics; `dropped` / `fracs` (one per estimate, a frac of None: not reported) add the
    per-estimate "dropped" and "nonfinite_frac" entries."""
    per = [{"meta_loss": jnp.asarray(v), "resets": jnp.asarray(1, jnp.int32)} for v in losses]
    for i, m in enumerate(per):
        if dropped is not None:
            m["dropped"] = jnp.asarray(dropped[i], jnp.int32)
        if fracs is not None and fracs[i] is not None:
            m["nonfinite_frac"] = jnp.asarray(fracs[i], jnp.float32)
    return {"meta_loss": jnp.asarray(0.5), "grad_norm": jnp.asarray(2.0), "theta_norm": jnp.asarray(3.0),
            "num_dropped": jnp.asarray(num_dropped, jnp.int32), PER_ESTIMATE: tuple(per)}


def test_estimator_labels_name_the_estimator_and_its_truncated_step():
    a, b = _pes(4), _pes(6)
    assert estimator_labels([a, b]) == ["TruncatedPES/quadratic_dim4", "TruncatedPES/quadratic_dim6"]
    assert estimator_labels([a, a]) == ["TruncatedPES/quadratic_dim4_0", "TruncatedPES/quadratic_dim4_1"]
    assert estimator_labels([ot.TruncatedES(InfluenceBalancing(), 2, 1, std=0.1)]) == ["TruncatedES/InfluenceBalancing"]


def test_name_metrics_flattens_per_estimate_metrics_under_labels():
    named = name_metrics(_metrics(losses=(1.0, 2.0)), ["A/x", "B/y"])
    assert named == {"meta_loss": 0.5, "grad_norm": 2.0, "theta_norm": 3.0, "num_dropped": 0,
                     "meta_loss/A/x": 1.0, "resets/A/x": 1, "meta_loss/B/y": 2.0, "resets/B/y": 1}
    with pytest.raises(ValueError, match="1 labels for 2 estimates"):
        name_metrics(_metrics(losses=(1.0, 2.0)), ["A/x"])


def test_reporter_logs_every_n_steps_the_last_and_eval_steps(tmp_path):
    evals = []
    evaluator = lambda theta: evals.append(theta) or {"eval/final_loss": 0.25}
    with Reporter(str(tmp_path), start=0, target=5, progress=False, log_every=2, tensorboard=False,
                  meta_evaluator=evaluator, eval_every=3, totals=RunTotals(10.0, 4)) as reporter:
        logged = [reporter.report(s, _metrics(), labels=["A/x"], inner_steps=8, theta=s) for s in range(1, 6)]
        totals = reporter.totals()
    assert [m is not None for m in logged] == [False, True, True, True, True]
    assert evals == [3] and logged[2]["eval/final_loss"] == 0.25 and "eval/final_loss" not in logged[1]
    assert logged[1]["meta_loss/A/x"] == 1.0 and logged[1]["num_dropped_total"] == 4
    assert logged[1]["elapsed_s"] >= 10.0 and logged[1]["inner_steps_per_s"] > 0
    assert totals.elapsed_s >= 10.0 and totals.num_dropped_total == 4
    lines = metrics_lines(tmp_path)
    assert [line["step"] for line in lines] == [2, 3, 4, 5]


def test_reporter_counts_dropped_estimates_and_warns_once():
    reporter = Reporter(None, start=0, target=3, progress=False)
    with pytest.warns(RuntimeWarning, match=r"1 of 2 estimates had a non-finite.*: B \(25.0% of its inner steps non-f"):
        reporter.report(1, _metrics(num_dropped=1, losses=(1.0, 2.0), dropped=(0, 1), fracs=(0.0, 0.25)),
                        labels=["A", "B"], inner_steps=0)
    logged = reporter.report(2, _metrics(num_dropped=2, losses=(1.0, 2.0)), labels=["A", "B"], inner_steps=0)
    reporter.close()
    assert logged["num_dropped"] == 2 and logged["num_dropped_total"] == 3
    assert reporter.totals().num_dropped_total == 3


def test_run_totals_round_trip_through_checkpoint_metadata():
    totals = RunTotals(1.5, 2, 3)
    assert RunTotals.from_meta(totals.as_meta()) == totals
    assert RunTotals.from_meta({"elapsed_s": 1.0, "num_dropped_total": 2}) == RunTotals(1.0, 2, 0)  # older checkpoints


def test_reporter_stops_after_max_consecutive_steps_that_applied_nothing(tmp_path):
    """Steps in which every estimate was dropped count in a row (from the resumed totals on); one that applied
    something resets the count; the step that reaches the limit is logged, then MetaTrainingDiverged names the
    estimators, their non-finite fractions and the step the run of dropped steps began."""
    all_dropped = lambda frac: _metrics(num_dropped=2, losses=(0.0, 0.0), dropped=(1, 1), fracs=(frac, None))
    steps = {1: all_dropped(1.0), 2: _metrics(num_dropped=1, losses=(1.0, 0.0), dropped=(0, 1), fracs=(0.0, None)),
             3: all_dropped(1.0), 4: all_dropped(1.0), 5: all_dropped(0.5)}
    reporter = Reporter(str(tmp_path), start=0, target=10, progress=False, log_every=4, tensorboard=False,
                        totals=RunTotals(consecutive_dropped=1), max_consecutive_dropped=3)
    with pytest.warns(RuntimeWarning, match="no valid inner step"):
        for step in (1, 2, 3, 4):
            reporter.report(step, steps[step], labels=["A/x", "B/y"], inner_steps=0)
    assert reporter.totals().consecutive_dropped == 2
    with pytest.raises(MetaTrainingDiverged, match=r"the 3 outer steps 3-5 .*A/x \(83.3% of its inner steps "
                                                   r"non-finite\); B/y \(non-finite meta-loss or gradient\)") as info:
        reporter.report(5, steps[5], labels=["A/x", "B/y"], inner_steps=0)
    reporter.close()
    assert (info.value.step, info.value.since) == (5, 3)
    assert info.value.estimators == {"A/x": pytest.approx(2.5 / 3), "B/y": None}
    lines = metrics_lines(tmp_path)
    assert [line["step"] for line in lines] == [4, 5]  # step 5 is logged although log_every=4
    assert lines[-1]["dropped/A/x"] == 1 and lines[-1]["nonfinite_frac/A/x"] == 0.5


def test_reporter_max_consecutive_dropped_is_validated():
    with pytest.raises(ValueError, match="max_consecutive_dropped must be >= 1"):
        Reporter(None, start=0, target=1, progress=False, max_consecutive_dropped=0)
    Reporter(None, start=0, target=1, progress=False, max_consecutive_dropped=None).close()

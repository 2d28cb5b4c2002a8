"""The held-out protocol: validation and test losses measured in the training program, VeLOdrome on held-out
loss, time to target in wall-clock, and the splits an evaluation accepts."""
import jax
import numpy as np
import optax
import pytest

import tasks
from outer_trainers import evaluation
from outer_trainers.evaluation import aggregate, protocol, scores, suite_runs, wall_clock
from outer_trainers.evaluation.task_trainer import make_task_trainer, task_draws, valid_schedule


def test_valid_schedule_is_evenly_spaced_and_ends_at_the_budget():
    assert valid_schedule(23, 5) == (7, 11, 15, 19, 23)    # c = 4, the remainder 3 before the first point
    assert valid_schedule(20, 4) == (5, 10, 15, 20)
    assert valid_schedule(3, 20) == (1, 2, 3) and valid_schedule(9, 1) == (9,)
    with pytest.raises(ValueError, match="valid_points"):
        valid_schedule(10, 0)


def test_the_validation_curve_is_measured_in_the_training_program():
    """On a noise-free quadratic the validation loss after t steps is the train loss of step t + 1; the train
    losses are those of the trainer without validation, the test loss is measured as before."""
    fam = tasks.QuadraticFamily(dim=3)
    cfgs, keys = task_draws(fam, (0, 1))
    lr = np.float32(0.05)
    losses, evals = make_task_trainer(fam, optax.sgd, 11)(lr, cfgs, keys, None)
    calls = []
    counted = lambda a: calls.append(1) or optax.sgd(a)
    trainer = make_task_trainer(fam, counted, 11, valid_split="inner_valid", valid_points=4)
    out = trainer(lr, cfgs, keys, None)
    np.testing.assert_array_equal(out["losses"], losses)
    np.testing.assert_array_equal(out["evals"], evals)
    steps = valid_schedule(11, 4)                                         # (2, 5, 8, 11)
    np.testing.assert_allclose(out["valid_curve"][:, :-1], np.asarray(losses)[:, [t for t in steps[:-1]]], rtol=1e-6)
    np.testing.assert_array_equal(out["valids"], out["valid_curve"][:, -1])
    np.testing.assert_allclose(out["valids"], evals, rtol=1e-6)           # one objective: validation = test
    assert "accuracy" not in out and out["valid_curve"].shape == (2, 4)
    n = len(calls)
    trainer(np.float32(0.01), cfgs, keys, None)                            # another rate: no recompilation
    assert len(calls) == n


def test_a_classifier_reports_test_accuracy():
    fam = tasks.ImageMLPFamily("digits", (8,), batch_size=16, init_scale_range=(1.0, 1.0), activations=("tanh",))
    cfgs, keys = task_draws(fam, (0, 1))
    run = protocol.run_fixed(fam, "adam", optax.adam, np.float32(0.02), cfgs, keys, 12, valid_points=3)
    assert run["accuracy"].shape == (2,) and np.all((run["accuracy"] >= 0) & (run["accuracy"] <= 1))
    assert run["accuracy"].min() > 0.1 and list(run["valid_steps"]) == [4, 8, 12]   # 12 Adam steps beat chance
    assert np.all(np.isfinite(run["valids"])) and not np.allclose(run["valids"], run["evals"])  # other data


def _held_out_run(name, train, curve, steps=(5, 10, 15, 20), lr=float("nan"), tests=None, seconds=None):
    curve = np.asarray(curve, np.float64)
    run = {"optimizer": name, "learning_rate": lr, "losses": np.full((curve.shape[0], steps[-1]), train),
           "evals": curve[:, -1] * 1.1 if tests is None else np.asarray(tests, np.float64),
           "valids": curve[:, -1], "valid_curve": curve, "valid_steps": np.asarray(steps)}
    return run if seconds is None else {**run, "step_seconds": seconds}


def test_velodrome_is_measured_on_the_baselines_validation_curve():
    # L wins on train loss (0.1 vs 0.2) and ends at validation 0.5; the baseline's median validation curve
    # (2, 1, 0.4, 0.3) first reaches 0.5 after 15 of 20 steps
    run = _held_out_run("learned", 0.1, [[1.0, 0.8, 0.6, 0.5]] * 3, tests=[0.6, 0.7, 0.8])
    base = _held_out_run("adam", 0.2, [[2.0, 1.0, 0.4, 0.3], [2.0, 1.0, 0.4, 0.3], [3.0, 3.0, 3.0, 3.0]],
                         tests=[0.4, 0.4, 0.4])
    c = protocol.compare_runs(run, base)
    assert c["velodrome_on"] == "validation" and c["velodrome_steps"] == 15 and c["velodrome_ratio"] == 0.75
    assert c["win_train"] and not c["win_eval"] and c["ratio_eval"] == pytest.approx(0.7 / 0.4)
    assert c["valid"] == 0.5 and c["baseline_valid"] == 0.3 and c["ratio_valid"] == pytest.approx(0.5 / 0.3)
    s = aggregate.summarize({"t": c}, {"t": (run, base)}, n_resamples=200)
    assert s["intervals"]["velodrome_ratio"]["iqm"] == 0.75 and s["wins_eval"] == 0 and s["wins_train"] == 1
    never = protocol.compare_runs(_held_out_run("learned", 0.1, [[1.0, 0.5, 0.2, 0.1]] * 3), base)
    assert never["velodrome_steps"] is None and never["velodrome_ratio"] == np.inf
    assert aggregate.pair_strata(_held_out_run("learned", 0.1, [[1.0, 0.5, 0.2, 0.1]] * 3), base,
                                 never)["velodrome_ratio"][1](
        np.concatenate([np.full((3, 1), 0.1), base["valid_curve"]], axis=-1)[None])[0] == np.inf


def test_time_to_target_is_the_step_reaching_tuned_adamws_validation_loss_times_the_step_time():
    runs = [_held_out_run("learned", 0.1, [[0.6, 0.25, 0.2, 0.2]] * 2, seconds=0.01),
            _held_out_run("adamw", 0.2, [[1.0, 0.5, 0.4, 0.3]] * 2, lr=1e-3, seconds=0.02),
            _held_out_run("adamw", 0.1, [[1.0, 0.5, 0.45, 0.45]] * 2, lr=1e-2, seconds=0.02),  # train-best rate
            _held_out_run("sgdm", 0.3, [[1.0, 0.9, 0.8, 0.7]] * 2, lr=0.1, seconds=0.005)]
    t = suite_runs.target_times(runs)
    assert t["target"] == 0.3                                     # AdamW at its validation-best rate (1e-3)
    assert t["optimizers"]["learned"] == {"steps": 10, "step_seconds": 0.01, "seconds": pytest.approx(0.1)}
    assert t["optimizers"]["adamw"] == {"steps": 20, "step_seconds": 0.02, "seconds": pytest.approx(0.4)}
    assert t["optimizers"]["sgdm"] == {"steps": None, "step_seconds": 0.005, "seconds": None}
    assert suite_runs.target_times([r for r in runs if r["optimizer"] != "adamw"])["target"] is None
    table = evaluation.time_to_target_table({"task": t})
    assert "| task | 0.3 | learned | 10 | 10 | 0.1 |" in table and "| task | 0.3 | sgdm | never | 5 | — |" in table


def test_step_seconds_times_one_run_of_the_task():
    fam = tasks.QuadraticFamily(dim=3)
    cfgs, keys = task_draws(fam, (0, 1))
    s = wall_clock.step_seconds(fam, optax.sgd, np.float32(0.1), cfgs, keys, num_steps=5, repeats=2)
    assert 0 < s < 1.0


def test_an_evaluation_refuses_a_validation_split_that_is_the_eval_split_or_missing(tmp_path):
    import jax.numpy as jnp
    from tasks.datasets.data_source import DataSource
    x = {"image": jnp.zeros((8, 4)), "label": jnp.zeros((8,), jnp.int32)}
    data = DataSource(splits={"train": x, "test": x}, batch_size=4, name="tiny", num_classes=2)
    task = tasks.ImageMLPFamily(data, (4,), batch_size=4)
    with pytest.raises(ValueError, match="valid_split 'inner_valid' is not a split of .*'test', 'train'"):
        evaluation.evaluate(str(tmp_path / "a"), optimizers=["adam"], tasks=[task], log=None)
    with pytest.raises(ValueError, match="valid_split 'test' is quadratic_dim2's eval split"):
        evaluation.evaluate(str(tmp_path / "b"), optimizers=["adam"], tasks=[tasks.QuadraticFamily(dim=2)],
                            valid_split="test", log=None)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    assert scores.diverged({"losses": np.ones((1, 3)), "evals": np.ones(1), "valids": np.array([np.nan])})

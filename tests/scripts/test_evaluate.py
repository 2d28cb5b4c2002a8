"""scripts/evaluate.py: learned optimizer vs lr-tuned Adam and SGD-momentum -> CSV, PNG, Markdown."""
import csv
import json
import os

import gin
import jax
import numpy as np
import pytest

import lopt
from outer_trainers import evaluation
from outer_trainers.evaluation import suite_runs


@pytest.fixture
def evaluate_script():
    import evaluate  # scripts/ is on sys.path via conftest
    gin.clear_config()
    yield evaluate
    gin.clear_config()


def _theta(tmp_path):
    lo = lopt.LearnableSGD(0.1)
    path = str(tmp_path / "theta.msgpack")
    lopt.save_theta(path, lo, lo.init(jax.random.key(0)))
    return path


def _strict_json(path):
    def refuse(name):
        raise AssertionError(f"results.json holds {name}, which is not JSON")
    return json.loads(path.read_text(), parse_constant=refuse)


@pytest.mark.slow  # the fast tier runs the script end to end in the scheduled-AdamW test below
def test_tiny_task_list_writes_every_file_with_tuned_baselines(evaluate_script, tmp_path):
    theta_path = _theta(tmp_path)
    out = tmp_path / "eval"
    res = evaluate_script.main(["--theta", theta_path, "--task", "QuadraticFamily(dim=4)", "--task", "RosenbrockTask",
                                "--num_steps", "10", "--num_seeds", "2", "--baselines", "adam,sgdm",
                                "--gin_param", "BaselineTuning.top_k = None",  # the full grid: every seed, every rate
                                "--output_dir", str(out)])
    assert set(res["results"]) == {"quadratic_dim4", "rosenbrock"}
    doc = _strict_json(out / "results.json")
    rows = list(csv.DictReader(open(out / "results.csv")))
    for task, entry in doc["tasks"].items():
        assert entry["num_steps"] == 10 and entry["seeds"] == [0, 1] and entry["eval_split"] == "test"
        for base in ("adam", "sgdm"):
            b = entry["optimizers"][base]
            lrs = b["learning_rates"]
            assert len(lrs) >= 7 and lrs == sorted(lrs)  # the 7-point grid, perhaps extended
            # the best rate is inside the grid, or the grid hit its extension cap (4 x 2 rates) and says so
            assert b["grid_edge"] is None or len(lrs) == 7 + 2 * 4
            assert b["best_learning_rate"] in lrs
            assert len([r for r in rows if r["task"] == task and r["optimizer"] == base]) == 2 * len(lrs)
        learned = entry["optimizers"]["learned"]
        assert learned["learning_rates"] is None and len(learned["final_train"]) == 2
        c = entry["comparisons"]["learned vs adam"]
        if task == "rosenbrock":  # SGD at 0.1 blows up there: reported as diverged, never as a number
            assert c["diverged"] and c["ratio_train"] is None and not c["win_train"] and c["speedup"] == 0.0
            assert learned["every_rate_diverged"] and learned["final_train"] == [None, None]
            continue
        finals = [float(r["final_train_loss"]) for r in rows if r["task"] == task and r["optimizer"] == "learned"]
        np.testing.assert_allclose(sorted(finals), sorted(learned["final_train"]), rtol=1e-5)
        assert c["final_train"] == pytest.approx(np.median(learned["final_train"]))
        assert c["baseline_final_train"] == pytest.approx(np.median(entry["optimizers"]["adam"]["final_train"]))
        assert c["ratio_train"] == pytest.approx(c["final_train"] / c["baseline_final_train"])
    s = doc["summary"]["learned vs adam"]
    assert s["diverged"] == ["rosenbrock"] and s["iqm_ratio_train"] is None  # inf: one of two tasks diverged
    assert s["num_tasks"] == 2 and s["wins_train"] == sum(
        doc["tasks"][t]["comparisons"]["learned vs adam"]["win_train"] for t in doc["tasks"])
    assert set(doc["summary"]) == {"learned vs adam", "learned vs sgdm"} and doc["cpu_seconds"] > 0
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "performance_profile.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for metric in ("ratio_train", "ratio_eval", "speedup", "velodrome_ratio"):
        assert set(s["intervals"][metric]) == {"iqm", "ci_low", "ci_high"}
    assert s["intervals"]["ratio_train"] == {"iqm": None, "ci_low": None, "ci_high": None}  # inf: as its IQM
    profile = doc["performance_profile"]
    assert profile["tasks"] == ["quadratic_dim4", "rosenbrock"] and profile["ratios"]["learned"][1] is None
    assert min(r[0] for r in profile["ratios"].values()) == 1.0  # the best on a task has ratio 1
    md = (out / "results.md").read_text()
    assert "IQM VeLOdrome on validation loss, steps / budget [95% CI]" in md and "**Performance profile**" in md
    assert md.index("**Test loss at the end of training**") < md.index("**Train loss** (secondary")
    quad = doc["tasks"]["quadratic_dim4"]
    for base in ("adam", "sgdm"):  # the rate of lowest median validation loss; the csv holds every run's losses
        b = quad["optimizers"][base]
        valid = {float(r["learning_rate"]): [] for r in rows if r["task"] == "quadratic_dim4" and r["optimizer"] == base}
        for r in rows:
            if r["task"] == "quadratic_dim4" and r["optimizer"] == base:
                valid[float(r["learning_rate"])].append(float(r["valid_loss"]) if r["valid_loss"] != "nan" else np.inf)
        medians = {lr: np.median(v) for lr, v in valid.items()}
        assert b["best_learning_rate"] == pytest.approx(min(medians, key=medians.get), rel=1e-5)
        assert np.median(b["valid"]) == pytest.approx(min(medians.values()), rel=1e-5)
        assert b["valid_steps"][-1] == 10 and len(b["valid_curve"]) == 2 and b["step_seconds"] > 0
    c = quad["comparisons"]["learned vs adam"]
    assert c["eval"] == pytest.approx(np.median(quad["optimizers"]["learned"]["eval"]))
    assert c["ratio_eval"] == pytest.approx(c["eval"] / c["baseline_eval"]) and c["velodrome_on"] == "validation"
    assert quad["time_to_target"]["target"] is None  # no AdamW among the baselines: no target
    assert "| learned vs adam | 2 |" in md and "| quadratic_dim4 | 10 | learned | — |" in md
    assert "| rosenbrock | 10 | sgdm |" in md and "**learned vs sgdm**" in md
    assert "| rosenbrock | diverged |" in md and "| learned vs adam | 2 | " in md and "| inf [inf, inf] | " in md
    # A second evaluation into the same directory is refused and leaves the first one's files as they were.
    def files():
        return {str(f): f.read_bytes() for f in out.rglob("*") if f.is_file()}
    before = files()
    args = ["--theta", theta_path, "--task", "QuadraticFamily(dim=4)", "--num_steps", "5", "--num_seeds", "1",
            "--baselines", "adam", "--output_dir", str(out)]
    gin.clear_config()
    with pytest.raises(ValueError, match=r"already holds the results of an evaluation \(results.csv, curves.png"):
        evaluate_script.main(args)
    assert files() == before
    gin.clear_config()
    evaluate_script.main(args + ["--overwrite"])
    assert list(_strict_json(out / "results.json")["tasks"]) == ["quadratic_dim4"]


@pytest.mark.slow
def test_smoke_suite_brings_its_own_steps_and_seeds(evaluate_script, tmp_path):
    from tasks import suites
    out = tmp_path / "suite"
    evaluate_script.main(["--suite", "smoke", "--optimizer", _theta(tmp_path), "--baselines", "adam",
                          "--gin_param", "BaselineTuning.max_extensions = 0",  # fewer compiles
                          "--gin_param", "evaluate.time_steps = False",
                          "--output_dir", str(out)])
    doc = _strict_json(out / "results.json")
    assert doc["suite"] == "smoke" and doc["optimizers"] == {"learned": str(tmp_path / "theta.msgpack")}
    smoke = suites.get("smoke")
    assert list(doc["tasks"]) == [t.name for t in smoke]
    for t in smoke:
        entry = doc["tasks"][t.name]
        assert entry["num_steps"] == t.num_steps and entry["seeds"] == list(t.seeds)
        assert entry["seconds"]["learned"] > 0 and entry["seconds"]["adam"] > 0
        adam = entry["optimizers"]["adam"]
        assert all(np.isfinite(adam["final_train"])) and np.median(adam["final_train"]) < np.median(
            adam["initial_train"])  # tuned Adam trains every smoke task
    assert doc["summary"]["learned vs adam"]["num_tasks"] == 3
    assert "| learned vs adam | 3 |" in (out / "results.md").read_text()


@pytest.mark.slow
def test_muon_is_a_baseline_and_plots_can_be_left_out(evaluate_script, tmp_path):
    out = tmp_path / "m"
    task = "ImageMLPFamily(hidden_sizes=(8,), batch_size=16)"
    res = evaluate_script.main(["--theta", _theta(tmp_path), "--task", task,
                                "--num_steps", "12", "--num_seeds", "3", "--baselines", "muon:cosine", "--no_plots",
                                "--gin_param", "BaselineTuning.max_extensions = 0",
                                "--gin_param", "BaselineTuning.muon_weight_decays = [0.0, 0.1]",  # fewer runs
                                "--gin_param", "evaluate.n_resamples = 300", "--gin_param", "evaluate.time_steps = False",
                                "--output_dir", str(out)])
    assert sorted(f.name for f in out.iterdir()) == ["curves.npz", "finished_tasks", "results.csv", "results.json", "results.md"]
    doc = _strict_json(out / "results.json")
    task = doc["tasks"]["image_mlp_family_digits_8"]
    muon = task["optimizers"]["muon:cosine"]
    # the two-stage rule: two seeds over 7 rates x 2 decays, then every seed at the 3 best points
    assert len(muon["settings"]) == 3 and muon["best_learning_rate"] in muon["learning_rates"]
    assert set(muon["learning_rates"]) <= set(evaluation.default_lrs("muon"))
    assert muon["best_schedule"] == "cosine" and muon["best_weight_decay"] in (0.0, 0.1)
    assert doc["protocol"]["grid"] == {"muon:cosine": list(evaluation.default_lrs("muon"))}
    assert doc["protocol"]["weight_decays"] == {"adamw": list(evaluation.DEFAULT_WEIGHT_DECAYS), "muon": [0.0, 0.1]}
    assert "two_stage" in doc["protocol"] and doc["protocol"]["warmup_fraction"] == 0.05
    c = task["comparisons"]["learned vs muon:cosine"]
    assert c["ratio_train"] == pytest.approx(c["final_train"] / c["baseline_final_train"])
    assert c["velodrome_steps"] is None or c["velodrome_ratio"] == pytest.approx(c["velodrome_steps"] / 12)
    s = res["summary"]["learned vs muon:cosine"]
    assert s["intervals"]["ratio_train"]["iqm"] == pytest.approx(c["ratio_train"])  # one task: its ratio
    assert s["intervals"]["ratio_train"]["ci_low"] <= s["intervals"]["ratio_train"]["ci_high"]
    md = (out / "results.md").read_text()
    assert "| learned vs muon:cosine | 1 |" in md and " cosine |" in md  # the table names rate, decay, schedule
    assert "![performance profile]" not in md
    rows = list(csv.DictReader(open(out / "results.csv")))
    assert {r["schedule"] for r in rows if r["optimizer"] == "muon:cosine"} == {"cosine"}


def test_scheduled_adamw_with_its_schedule_tuned_is_a_baseline_and_the_time_to_target(evaluate_script, tmp_path):
    out = tmp_path / "w"
    res = evaluate_script.main(["--optimizer", "adam:linear", "--task", "QuadraticFamily(dim=4)", "--num_steps", "10",
                                "--num_seeds", "2", "--baselines", "adamw:tuned", "--no_plots",
                                "--gin_param", "BaselineTuning.max_extensions = 0",
                                "--gin_param", "BaselineTuning.adamw_weight_decays = [0.0, 0.1]",
                                "--gin_param", "evaluate.n_resamples = 100", "--output_dir", str(out)])
    doc = _strict_json(out / "results.json")
    quad = doc["tasks"]["quadratic_dim4"]
    adamw, adam = quad["optimizers"]["adamw:tuned"], quad["optimizers"]["adam:linear"]
    assert adamw["best_schedule"] in ("constant", "cosine") and adamw["best_weight_decay"] in (0.0, 0.1)
    assert {s[2] for s in adam["settings"]} == {"linear"} and {s[1] for s in adam["settings"]} == {0.0}
    assert quad["time_to_target"]["target"] == pytest.approx(np.median(adamw["valid"]))  # adamw:tuned's loss
    assert doc["protocol"]["time_to_target_baseline"] == "adamw:tuned"
    assert list(res["summary"]) == ["adam:linear vs adamw:tuned"]


@pytest.mark.slow  # a whole evaluation: two tuned grids, the time-to-target measurement
def test_a_shipped_optimizers_rules_on_adamw_are_a_tuned_baseline(evaluate_script, tmp_path):
    """rules:celo2_v9@adamw as an optimizer and, with a part left out, as a baseline: tuned over the rate, AdamW's
    own decay 0 where the chain holds the weight-decay rule."""
    out = tmp_path / "r"
    res = evaluate_script.main(["--optimizer", "rules:celo2_v9@adamw", "--task", "QuadraticFamily(dim=4)",
                                "--num_steps", "10", "--num_seeds", "2",
                                "--baselines", "rules:celo2_v9-conv_step_scaled@adamw", "--no_plots",
                                "--gin_param", "BaselineTuning.max_extensions = 0",
                                "--gin_param", "BaselineTuning.adamw_lrs = [0.01, 0.1]",
                                "--gin_param", "evaluate.n_resamples = 100", "--output_dir", str(out)])
    quad = _strict_json(out / "results.json")["tasks"]["quadratic_dim4"]
    decays = {r["part"] for r in lopt.pretrained.info("celo2_v9")["rules"]} >= {"loss_aware_decay"}
    for name in ("rules:celo2_v9@adamw", "rules:celo2_v9-conv_step_scaled@adamw"):
        settings = quad["optimizers"][name]["settings"]
        assert {s[0] for s in settings} == {0.01, 0.1}
        assert {s[1] for s in settings} == ({0.0} if decays else {0.0, 1e-3, 1e-2, 0.1, 1.0})
    assert list(res["summary"]) == ["rules:celo2_v9@adamw vs rules:celo2_v9-conv_step_scaled@adamw"]


def test_the_default_baselines_are_scheduled_adamw_muon_and_sgdm_and_constant_adam():
    import inspect
    default = ("adam", "adamw:tuned", "muon:tuned", "sgdm:tuned")
    assert inspect.signature(evaluation.evaluate).parameters["baselines"].default == default
    assert evaluation.DEFAULT_BASELINES == default
    assert evaluation.BaselineTuning().tuned_schedules == ("constant", "cosine")


def test_a_task_declaring_its_trivial_loss_flags_a_collapsed_run(evaluate_script, tmp_path):
    import tasks

    class Declared(tasks.QuadraticFamily):  # a trivial loss no run gets 5% below: every run counts as collapsed
        def task_fn(self, cfg):
            task = super().task_fn(cfg)
            task.trivial_loss = lambda: 1e-12
            return task

    assert evaluation.trivial_losses(Declared(dim=4), [0, 1]) == [1e-12, 1e-12]
    assert evaluation.trivial_losses(tasks.QuadraticFamily(dim=4), [0, 1]) is None
    res = evaluation.evaluate(str(tmp_path / "e"), optimizers=[_theta(tmp_path)], tasks=[Declared(dim=4)],
                              num_steps=10, num_seeds=2, baselines=["adam"],
                              tuning=evaluation.BaselineTuning(max_extensions=0), n_resamples=200,
                              plots=False, log=None)
    c = res["comparisons"]["learned vs adam"]["quadratic_dim4"]
    assert c["collapsed"] and c["trivial_loss"] == 1e-12 and c["below_initial"]  # the old check would pass it
    assert res["summary"]["learned vs adam"]["collapsed"] == ["quadratic_dim4"]
    md = (tmp_path / "e" / "results.md").read_text()
    assert "(collapsed)" in md and "| quadratic_dim4 |" in md
    doc = evaluation.stress_test(str(tmp_path / "s"), stress_steps=20, optimizers=[_theta(tmp_path)],
                                 tasks=[Declared(dim=4)], num_seeds=2, log=None)
    st = doc["tasks"]["quadratic_dim4"]["learned"]
    assert st["collapsed"] == [True, True] and st["ok"] == [False, False] and not doc["all_ok"]
    assert all(f < i for f, i in zip(st["final"], st["initial"]))
    assert "**collapsed**" in (tmp_path / "s" / "stress.md").read_text()


def test_pretrained_optimizers_are_loaded_with_the_task_horizon(evaluate_script, tmp_path, monkeypatch):
    import optax
    from lopt import pretrained
    calls = []

    def load(name, num_steps=None):
        calls.append((name, num_steps))
        return optax.sgd(0.05)

    monkeypatch.setattr(pretrained, "names", lambda: ["tiny"], raising=False)
    monkeypatch.setattr(pretrained, "load", load, raising=False)
    with pytest.raises(ValueError, match=r"--optimizer pretrained:nope: no pretrained optimizer named 'nope'; "
                                         r"lopt.pretrained.names\(\) = \['tiny'\]"):
        evaluate_script.main(["--optimizer", "pretrained:nope", "--task", "QuadraticFamily(dim=2)",
                              "--output_dir", str(tmp_path / "x")])
    assert not (tmp_path / "x").exists()
    gin.clear_config()
    res = evaluate_script.main(["--optimizer", "pretrained:tiny", "--task", "QuadraticFamily(dim=2)", "--num_steps",
                                "7", "--num_seeds", "1", "--baselines", "", "--output_dir", str(tmp_path / "p")])
    assert set(calls) == {("tiny", 7)}
    run = res["results"]["quadratic_dim2"][0]
    assert run["optimizer"] == "pretrained:tiny" and run["losses"].shape == (1, 7)
    assert run["losses"][0, -1] < run["losses"][0, 0]  # plain SGD 0.05 on a quadratic descends


def test_a_suite_task_without_its_data_is_named_before_any_work(evaluate_script, tmp_path, monkeypatch):
    from tasks import registry, suites
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("LOPT_DATA_DIR", raising=False)
    monkeypatch.setattr(registry, "_CACHE", {})
    mnist = [t for t in suites.get("heldout-cpu-mnist") if t.dataset == "mnist_14"][0]
    monkeypatch.setitem(suites._SUITES, "only-mnist", (mnist,))
    monkeypatch.setattr(suite_runs, "run_task", lambda *a, **k: pytest.fail("trained despite missing data"))
    if os.path.isdir("/usr/share/datasets/mnist"):
        pytest.skip("MNIST files are installed system-wide here, so they cannot be missing")
    with pytest.raises(ValueError, match=rf"suite 'only-mnist' task {mnist.name}: its data is missing: dataset 'mnist'"):
        evaluate_script.main(["--suite", "only-mnist", "--optimizer", "adam", "--output_dir", str(tmp_path / "o")])
    assert not (tmp_path / "o").exists()


def test_bad_task_spec_is_reported(evaluate_script):
    with pytest.raises(SystemExit, match="bad --task"):
        evaluate_script.task_bindings(["QuadraticFamily(4"])
    assert evaluate_script.task_bindings(["QuadraticFamily(dim=4, normalize=True)"]) == [
        "task0/QuadraticFamily.dim = 4", "task0/QuadraticFamily.normalize = True",
        "evaluate.tasks = [@task0/QuadraticFamily()]"]


@pytest.mark.parametrize("flags, what", [
    (["--num_seeds", "0"], r"num_seeds \(--num_seeds\) must be an integer >= 1, got 0"),
    (["--num_steps", "0"], r"num_steps \(--num_steps\) must be an integer >= 1, got 0"),
    (["--gin_param", "BaselineTuning.adam_lrs = []"], "adam_lrs must hold at least one learning rate"),
    (["--gin_param", "BaselineTuning.sgdm_lrs = [0.1, 0.0]"], "sgdm_lrs must hold .* finite and > 0"),
    (["--gin_param", "BaselineTuning.momentum = 1.0"], r"momentum must be in \[0, 1\)"),
    (["--gin_param", "evaluate.eval_split = 'valid'"], "eval_split 'valid' is not a split of"),
    (["--baselines", "adam,rmsprop"], r"unknown baselines \['rmsprop'\] \(--baselines\)"),
    (["--baselines", "adamw:cosin"], r"unknown schedule 'cosin' .*'constant', 'cosine', 'linear', 'tuned'"),
    (["--optimizer", "sgdm:warmup"], r"--optimizer unknown schedule 'warmup' .*'constant', 'cosine', 'linear'"),
    (["--gin_param", "BaselineTuning.top_k = 0"], r"top_k must be an integer >= 1 or None"),
    (["--gin_param", "BaselineTuning.adamw_weight_decays = [-1.0]"], r"weight_decays must hold .* >= 0"),
    (["--gin_param", "BaselineTuning.tuned_schedules = ['step']"], r"unknown schedule 'step'.*'cosine'"),
    (["--suite", "smoke"], r"give a suite \(--suite smoke\) or tasks \(--task\), not both"),
    (["--optimizer", "/no/such/theta.msgpack"], "is neither a baseline .* nor an existing theta or checkpoint file"),
    (["--optimizer", "TMP/garbage.msgpack"], "neither a theta file .* nor an outer_train checkpoint"),
    (["--gin_param", "BaselineTuning.max_extensions = -1"], "max_extensions must be an integer >= 0"),
    (["--optimizer", "pretrained:celo2_v9-no_part"], r"'no_part' is not a rule of celo2_v9's chain to leave out"),
    (["--optimizer", "untrained:celo2_v9#one"], r"seed after '#' must be an integer >= 0, got 'one'"),
    (["--baselines", "rules:celo2_v9@adamx"], r"unknown baselines \['rules:celo2_v9@adamx'\].*unknown baseline 'adamx'"),
    (["--baselines", "adam,pretrained:no_name-rules"], r"no pretrained optimizer named 'no_name'"),
])
def test_bad_arguments_are_refused_before_any_work_or_file(evaluate_script, tmp_path, monkeypatch, flags, what):
    """--num_seeds 0 / --num_steps 0 used to crash after writing a partial results.csv."""
    lo = lopt.LearnableSGD(0.1)
    theta_path = str(tmp_path / "theta.msgpack")
    lopt.save_theta(theta_path, lo, lo.init(jax.random.key(0)))
    monkeypatch.setattr(suite_runs, "run_task", lambda *a, **k: pytest.fail("trained despite a bad argument"))
    (tmp_path / "garbage.msgpack").write_bytes(b"not a theta file")
    out = tmp_path / "eval"
    args = ["--theta", theta_path, "--task", "ImageMLPFamily(hidden_sizes=(4,))", "--output_dir", str(out)]
    with pytest.raises(ValueError, match=what):
        evaluate_script.main(args + [f.replace("TMP", str(tmp_path)) for f in flags])
    assert not out.exists()


def test_no_tasks_no_optimizer_an_unknown_suite_or_a_file_as_output_dir_is_refused(evaluate_script, tmp_path):
    check = lambda out, opts, suite, tasks: evaluation.check_arguments(
        out, opts, suite, tasks, 10, 1, ["adam"], {"adam": (1e-3,)}, 0.9, "test")
    with pytest.raises(ValueError, match=r"no tasks; give --suite NAME \(one of \[.*'smoke'"):
        check(str(tmp_path), ["adam"], None, [])
    with pytest.raises(ValueError, match="no optimizer to evaluate; give --optimizer"):
        check(str(tmp_path), [], "smoke", [])
    with pytest.raises(ValueError, match="unknown suite 'nope'"):
        check(str(tmp_path), ["adam"], "nope", [])
    (tmp_path / "f").write_text("x")
    with pytest.raises(ValueError, match="is a file, not a directory"):
        check(str(tmp_path / "f"), ["adam"], "smoke", [])


def test_table_marks_an_optimizer_whose_every_setting_diverged(evaluate_script):
    import numpy as np
    run = lambda name, lr, final: {"optimizer": name, "learning_rate": lr, "losses": np.full((2, 10), final),
                                   "evals": np.ones(2), "valids": np.full(2, final)}
    results = {"t": [run("learned", float("nan"), 1.0), run("adam", 1e-3, np.nan), run("adam", 1e-2, np.inf),
                      run("sgdm", 1e-2, 2.0)]}
    table = evaluation.markdown_table(results, 10)
    assert "| t | 10 | adam | 0.001 (every setting diverged) |" in table
    assert "| t | 10 | learned | — |" in table and "| t | 10 | sgdm | 0.01 |" in table


def test_curves_of_positive_losses_get_a_log_axis_with_a_positive_bottom(evaluate_script, tmp_path, monkeypatch):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures = []
    monkeypatch.setattr(plt, "close", figures.append)  # keep the figure to inspect it
    losses = np.exp(-np.linspace(0.0, 5.0, 20))[None, :] * np.array([[1.0], [2.0]])  # [seeds, steps] > 0
    runs = [{"optimizer": "learned", "learning_rate": float("nan"), "losses": losses, "evals": np.ones(2),
             "valids": np.ones(2)},
            {"optimizer": "adam", "learning_rate": 0.01, "losses": 2 * losses, "evals": np.ones(2), "valids": np.ones(2)}]
    evaluation.plot_curves(str(tmp_path / "curves.png"), {"quadratic": runs})
    ax = figures[0].axes[0]
    assert ax.get_yscale() == "log"
    bottom, top = ax.get_ylim()
    assert 0 < bottom < losses.min() and top == pytest.approx(10 * 2 * np.median(losses[:, 0]))
    saturated = losses.copy()
    saturated[:, -3:] = 0.0  # a cross-entropy that reached exactly 0 keeps the log axis (clipped)
    evaluation.plot_curves(str(tmp_path / "zero.png"), {"q": [{**runs[0], "losses": saturated}]})
    assert figures[1].axes[0].get_yscale() == "log" and figures[1].axes[0].get_ylim()[0] > 0


def test_stress_steps_checks_each_learned_optimizer_at_the_given_horizon(evaluate_script, tmp_path, capsys):
    good = _theta(tmp_path)
    lo = lopt.LearnableSGD(0.1)
    bad = str(tmp_path / "bad.msgpack")  # SGD at rate 10 blows up on the dim-4 quadratic
    lopt.save_theta(bad, lo, jax.tree_util.tree_map(lambda x: x + np.log(100.0), lo.init(jax.random.key(0))))
    out = tmp_path / "stress"
    doc = evaluate_script.main(["--optimizer", good, "--optimizer", bad, "--task", "QuadraticFamily(dim=4)",
                                "--num_seeds", "2", "--stress_steps", "40", "--output_dir", str(out)])
    assert doc["stress_steps"] == 40 and not doc["all_ok"] and doc["failures"] == ["quadratic_dim4 / bad"]
    entry = doc["tasks"]["quadratic_dim4"]
    assert entry["theta"]["ok"] == [True, True] and entry["bad"]["ok"] == [False, False]
    saved = _strict_json(out / "stress.json")
    assert saved["failures"] == ["quadratic_dim4 / bad"] and saved["tasks"]["quadratic_dim4"]["theta"]["seeds"] == [0, 1]
    assert "FAILED: quadratic_dim4 / bad" in (out / "stress.md").read_text()
    assert not (out / "results.json").exists()  # no comparison was run
    gin.clear_config()
    with pytest.raises(ValueError, match="already holds a stability check"):
        evaluate_script.main(["--optimizer", good, "--task", "QuadraticFamily(dim=4)", "--stress_steps", "40",
                              "--output_dir", str(out)])
    gin.clear_config()
    with pytest.raises(ValueError, match="learned optimizers only"):
        evaluate_script.main(["--optimizer", "adam", "--task", "QuadraticFamily(dim=4)", "--stress_steps", "40",
                              "--output_dir", str(tmp_path / "s2")])
    gin.clear_config()
    with pytest.raises(SystemExit, match="no --baselines"):
        evaluate_script.main(["--optimizer", good, "--baselines", "adam", "--task", "QuadraticFamily(dim=4)",
                              "--stress_steps", "40", "--output_dir", str(tmp_path / "s3")])


# scripts/compare_tuning.py: the two-stage rule against the full grid (issue 58's agreement bar)

def _choice(lr, wd, schedule, valid, test):
    return {"learning_rate": lr, "weight_decay": wd, "schedule": schedule, "valid": valid, "test": test}


def test_compare_tuning_counts_agreement_and_reports_the_loss_ratio_where_the_choices_differ():
    import compare_tuning
    same = {m: {"choice": _choice(0.01, 0.1, "cosine", 0.5, 0.6), "wall_s": 10.0, "cpu_s": 5.0}
            for m in ("two_stage", "full")}
    differ = {"two_stage": {"choice": _choice(0.03, 0.01, "constant", 0.6, 0.9), "wall_s": 20.0, "cpu_s": 8.0},
              "full": {"choice": _choice(0.1, 0.01, "constant", 0.5, 1.0), "wall_s": 40.0, "cpu_s": 16.0}}
    assert compare_tuning.compare(same) == {"agree": True, "valid_ratio": 1.0, "test_ratio": 1.0}
    c = compare_tuning.compare(differ)
    assert not c["agree"] and c["valid_ratio"] == pytest.approx(1.2) and c["test_ratio"] == pytest.approx(0.9)
    md = compare_tuning.table({"a": same, "b": differ}, "adamw:tuned", "validation-cpu")
    assert "Agreement: 1 of 2 tasks." in md
    assert "| b | 0.03, 0.01, constant | 0.1, 0.01, constant | no | 1.2000 | 0.9000 | 20 / 8 | 40 / 16 |" in md
    assert "two_stage: 0.5 wall-min, 0.2 CPU-min over 2 tasks." in md
    with pytest.raises(ValueError, match=r"unknown mode 'half'"):
        compare_tuning.tuning_of("half")
    assert compare_tuning.tuning_of("full").top_k is None and compare_tuning.tuning_of("two_stage").top_k == 3


@pytest.mark.slow  # tunes one smoke task twice (70 grid points each)
def test_compare_tuning_runs_both_rules_on_a_suite_task_and_writes_the_table(tmp_path):
    import compare_tuning
    out = tmp_path / "cmp"
    # one stage-1 seed: the smoke tasks' seeds are few enough that the default two would be the full grid
    res = compare_tuning.main(["--suite", "smoke", "--only", "smoke_regression_dim8", "--in_process",
                               "--stage1_seeds", "1", "--output_dir", str(out)])
    r = res["smoke_regression_dim8"]
    assert set(r) == {"two_stage", "full"} and r["full"]["points"] >= 70 and r["two_stage"]["points"] == 3
    # the two-stage rule's choice is among the full grid's points, scored on the same seeds: never below its best
    full_best = min(s["valid"] for s in r["full"]["settings"])
    assert r["full"]["choice"]["valid"] == full_best and r["two_stage"]["choice"]["valid"] >= full_best * (1 - 1e-6)
    assert "Agreement:" in (out / "comparison.md").read_text()
    assert (out / "tasks" / "smoke_regression_dim8.json").exists()

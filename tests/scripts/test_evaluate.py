"""scripts/evaluate.py: learned optimizer vs lr-tuned Adam and SGD-momentum -> CSV, PNG, Markdown."""
import csv

import gin
import jax
import numpy as np
import pytest

import lopt


@pytest.fixture
def evaluate_script():
    import evaluate  # scripts/ is on sys.path via conftest
    gin.clear_config()
    yield evaluate
    gin.clear_config()


def test_tiny_task_list_writes_csv_png_and_table(evaluate_script, tmp_path):
    lo = lopt.LearnableSGD(0.1)
    theta_path = str(tmp_path / "theta.msgpack")
    lopt.save_theta(theta_path, lo, lo.init(jax.random.key(0)))
    out = tmp_path / "eval"
    results = evaluate_script.main(["--theta", theta_path, "--task", "QuadraticFamily(dim=4)",
                                    "--task", "RosenbrockTask", "--num_steps", "10", "--num_seeds", "2",
                                    "--output_dir", str(out)])
    assert set(results) == {"quadratic_dim4", "rosenbrock"}
    rows = list(csv.DictReader(open(out / "results.csv")))
    assert len(rows) == 2 * (1 + 7 + 7) * 2  # tasks x (learned + two 7-point lr grids) x seeds
    assert {r["optimizer"] for r in rows} == {"learned", "adam", "sgdm"}
    assert len({r["learning_rate"] for r in rows if r["optimizer"] == "adam"}) == 7
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = (out / "results.md").read_text()
    for name in ("| quadratic_dim4 | learned |", "| quadratic_dim4 | adam |", "| rosenbrock | sgdm |"):
        assert name in table
    # A second evaluation into the same directory is refused and leaves the first one's files as they were.
    before = {f.name: f.read_bytes() for f in out.iterdir()}
    args = ["--theta", theta_path, "--task", "QuadraticFamily(dim=4)", "--num_steps", "5", "--num_seeds", "1",
            "--output_dir", str(out)]
    gin.clear_config()
    with pytest.raises(ValueError, match=r"already holds the results of an evaluation \(results.csv, curves.png"):
        evaluate_script.main(args)
    assert {f.name: f.read_bytes() for f in out.iterdir()} == before
    gin.clear_config()
    evaluate_script.main(args + ["--overwrite"])
    assert len(list(csv.DictReader(open(out / "results.csv")))) == (1 + 7 + 7) * 1


def test_bad_task_spec_is_reported(evaluate_script):
    with pytest.raises(SystemExit, match="bad --task"):
        evaluate_script.task_bindings(["QuadraticFamily(4"])
    assert evaluate_script.task_bindings(["QuadraticFamily(dim=4, normalize=True)"]) == [
        "task0/QuadraticFamily.dim = 4", "task0/QuadraticFamily.normalize = True",
        "evaluate.tasks = [@task0/QuadraticFamily()]"]


@pytest.mark.parametrize("flags, what", [
    (["--num_seeds", "0"], r"num_seeds \(--num_seeds\) must be an integer >= 1, got 0"),
    (["--num_steps", "0"], r"num_steps \(--num_steps\) must be an integer >= 1, got 0"),
    (["--gin_param", "evaluate.adam_lrs = []"], "adam_lrs must hold at least one learning rate"),
    (["--gin_param", "evaluate.sgdm_lrs = [0.1, 0.0]"], "sgdm_lrs must hold .* finite and > 0"),
    (["--gin_param", "evaluate.momentum = 1.0"], r"momentum must be in \[0, 1\)"),
    (["--gin_param", "evaluate.eval_split = 'valid'"], "eval_split 'valid' is not a split of"),
])
def test_bad_arguments_are_refused_before_any_work_or_file(evaluate_script, tmp_path, monkeypatch, flags, what):
    """--num_seeds 0 / --num_steps 0 used to crash after writing a partial results.csv."""
    lo = lopt.LearnableSGD(0.1)
    theta_path = str(tmp_path / "theta.msgpack")
    lopt.save_theta(theta_path, lo, lo.init(jax.random.key(0)))
    monkeypatch.setattr(evaluate_script, "run_task", lambda *a, **k: pytest.fail("trained despite a bad argument"))
    out = tmp_path / "eval"
    args = ["--theta", theta_path, "--task", "ImageMLPFamily(hidden_sizes=(4,))", "--output_dir", str(out)]
    with pytest.raises(ValueError, match=what):
        evaluate_script.main(args + flags)
    assert not out.exists()


def test_no_tasks_or_a_file_as_output_dir_is_refused(evaluate_script, tmp_path):
    with pytest.raises(ValueError, match="no tasks"):
        evaluate_script.check_arguments(str(tmp_path), [], 10, 1, (1e-3,), (1e-2,), 0.9, "test")
    (tmp_path / "f").write_text("x")
    with pytest.raises(ValueError, match="is a file, not a directory"):
        evaluate_script.check_arguments(str(tmp_path / "f"), [], 10, 1, (1e-3,), (1e-2,), 0.9, "test")


def test_table_marks_an_optimizer_whose_every_setting_diverged(evaluate_script):
    import numpy as np
    run = lambda name, lr, final: {"optimizer": name, "learning_rate": lr, "losses": np.full((2, 10), final),
                                   "evals": np.ones(2)}
    results = {"t": [run("learned", float("nan"), 1.0), run("adam", 1e-3, np.nan), run("adam", 1e-2, np.inf),
                      run("sgdm", 1e-2, 2.0)]}
    table = evaluate_script.markdown_table(results, 10)
    assert "| t | adam | 0.001 (every setting diverged) |" in table
    assert "| t | learned | — |" in table and "| t | sgdm | 0.01 |" in table


def test_curves_of_positive_losses_get_a_log_axis_with_a_positive_bottom(evaluate_script, tmp_path, monkeypatch):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures = []
    monkeypatch.setattr(plt, "close", figures.append)  # keep the figure to inspect it
    losses = np.exp(-np.linspace(0.0, 5.0, 20))[None, :] * np.array([[1.0], [2.0]])  # [seeds, steps] > 0
    runs = [{"optimizer": "learned", "learning_rate": float("nan"), "losses": losses, "evals": np.ones(2)},
            {"optimizer": "adam", "learning_rate": 0.01, "losses": 2 * losses, "evals": np.ones(2)}]
    evaluate_script.plot_curves(str(tmp_path / "curves.png"), {"quadratic": runs})
    ax = figures[0].axes[0]
    assert ax.get_yscale() == "log"
    bottom, top = ax.get_ylim()
    assert 0 < bottom < losses.min() and top == pytest.approx(10 * 2 * np.median(losses[:, 0]))

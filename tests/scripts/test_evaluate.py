"""scripts/evaluate.py: learned optimizer vs lr-tuned Adam and SGD-momentum -> CSV, PNG, Markdown."""
import csv

import gin
import jax
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


def test_bad_task_spec_is_reported(evaluate_script):
    with pytest.raises(SystemExit, match="bad --task"):
        evaluate_script.task_bindings(["QuadraticFamily(4"])
    assert evaluate_script.task_bindings(["QuadraticFamily(dim=4, normalize=True)"]) == [
        "task0/QuadraticFamily.dim = 4", "task0/QuadraticFamily.normalize = True",
        "evaluate.tasks = [@task0/QuadraticFamily()]"]

"""scripts/benchmark_lm_scale.py: a tiny end-to-end run (every run reported, a diverged one as "diverged",
AdamW's rate chosen on validation loss, the token count), the 20M preset's size, and the refusals."""
import math

import pytest

import benchmark_lm_scale as bls  # scripts/ is on sys.path via conftest

STEPS, BATCH, SEQ = 5, 3, 12


def _table(report):
    """{(optimizer cell, rate cell): [the other cells]} of the report's table rows."""
    rows = [line for line in report.splitlines() if line.startswith("| ") and not line.startswith("| optimizer")]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in rows]
    return {(c[0], c[1]): c[2:] for c in cells}


def test_tiny_run_reports_every_run_and_picks_adamw_on_validation(tmp_path, capsys):
    """Three AdamW rates (one NaN, which must read "diverged", never a number, and never be chosen) and a
    published learned optimizer: each finite run has finite losses in the table, the row marked best AdamW
    is the AdamW rate of lowest validation loss, and the tokens are steps × batch × seq_len."""
    out = tmp_path / "lm.md"
    res = bls.main(["--size", "tiny", "--steps", str(STEPS), "--batch_size", str(BATCH), "--seq_len", str(SEQ),
                    "--valid_batches", "2", "--optimizer", "adamw", "--adamw_lrs", "1e-3,3e-2,nan",
                    "--optimizer", "published:celo_adam", "--output", str(out)])
    printed = capsys.readouterr().out
    report = out.read_text()
    assert report == res["report"] and report in printed and "Partial" not in report
    tokens = STEPS * BATCH * SEQ
    assert res["tokens"] == tokens and f"tokens {tokens:,} per run ({STEPS} × {BATCH} × {SEQ})" in printed
    assert f"= {tokens:,} tokens" in report and "python_stdlib" in report

    table = _table(report)
    assert len(table) == 4 and len(res["results"]) == 4
    adam = {}
    for (name, rate), (valid, test, train, *_) in table.items():
        if rate.startswith("nan"):
            assert valid == "diverged at step 1" and test == train == "diverged"
            continue
        assert all(math.isfinite(float(x)) for x in (valid, test, train)), (name, valid, test, train)
        if name.startswith("adamw"):
            adam[(name, float(rate.split()[0]))] = float(valid)
        else:
            assert name == "published:celo_adam" and rate == f"— (told {STEPS} steps)"
    assert len(adam) == 2 and len(set(adam.values())) == 2  # two finite rates, distinguishable
    (best_name, best_rate), _ = min(adam.items(), key=lambda kv: kv[1])
    assert best_name == "adamw (best AdamW)" and sum(n.endswith("(best AdamW)") for n, _ in table) == 1
    assert res["best_adamw"].rate == best_rate
    diverged = [r for r in res["results"] if r.diverged_at is not None]
    assert [(r.label, r.diverged_at, math.isnan(r.rate)) for r in diverged] == [("adamw", 1, True)]


def test_an_existing_output_is_refused_without_overwrite(tmp_path, capsys):
    out = tmp_path / "lm.md"
    out.write_text("an earlier report\n")
    args = ["--size", "tiny", "--optimizer", "adamw", "--output", str(out)]
    with pytest.raises(SystemExit):
        bls.main(args)
    assert out.read_text() == "an earlier report\n" and "--overwrite" in capsys.readouterr().err
    assert bls._args(args + ["--overwrite"]).overwrite  # accepted with --overwrite


def test_dry_run_of_the_20M_preset_builds_everything_and_trains_nothing(tmp_path, capsys):
    """The default optimizers resolve, the model has the documented 19,308,288 parameters, the default budget
    is 2000 × 32 × 256 tokens with the FLOPs the docstring states, and nothing is written."""
    out = tmp_path / "lm.md"
    res = bls.main(["--dry_run", "--output", str(out)])
    assert res["params"] == 19_308_288 and res["tokens"] == 2000 * 32 * 256 == 16_384_000
    assert res["flops_per_run"] == pytest.approx(2.04e15, rel=5e-3) and res["results"] == []
    assert "5 runs" in capsys.readouterr().out and not out.exists()


def test_an_unknown_optimizer_is_refused_before_anything_runs():
    with pytest.raises(SystemExit, match="no pretrained optimizer named 'nope'"):
        bls.main(["--size", "tiny", "--optimizer", "pretrained:nope"])
    with pytest.raises(SystemExit, match="only adamw is tuned here"):
        bls.main(["--size", "tiny", "--optimizer", "adam"])

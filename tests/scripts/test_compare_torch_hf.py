"""scripts/compare_torch_hf.py on a tiny GPT-2 (width 16, one layer, a few steps): every setup runs in a
Trainer, the one-line setup equals the hand-built one bit for bit, and the table and verdict are printed."""
import json

import pytest

pytest.importorskip("transformers", reason='transformers is not installed: pip install -e ".[test]"')

import compare_torch_hf  # noqa: E402  scripts/ is on sys.path via tests/conftest.py


def test_tiny_run_prints_the_table_and_the_one_line_setup_equals_the_hand_built_one(tmp_path, capsys):
    out = compare_torch_hf.main(["--source", "normmlp_v3", "--d", "16", "--layers", "1", "--length", "16",
                                 "--batch", "4", "--steps", "3", "--seeds", "0", "--rates", "1e-3,1e-2",
                                 "--eval-rows", "8", "--threads", "1", "--json", str(tmp_path / "r.json")])
    printed = capsys.readouterr().out
    assert [r["kind"] for r in out["results"]] == ["lopt hf", "lopt by hand", "AdamW", "AdamW"]
    assert out["per_seed"][0]["lopt hf"] == out["per_seed"][0]["lopt by hand"]  # bit for bit
    assert out["per_seed"][0]["AdamW (tuned)"] == min(r["test"] for r in out["results"] if r["kind"] == "AdamW"
                                                     and r["valid"] == min(q["valid"] for q in out["results"]
                                                                           if q["kind"] == "AdamW"))
    assert "| lopt hf |" in printed and "lopt hf vs by hand: +0.00 %" in printed
    assert json.load(open(tmp_path / "r.json"))["flags"]["source"] == "normmlp_v3"


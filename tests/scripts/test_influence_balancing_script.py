"""scripts/influence_balancing.py at a few particles and outer steps: every estimator's final θ is printed
and the plot is written where --out says (the meta-training itself: tests/outer_trainers/test_influence_balancing.py)."""
import re

import influence_balancing  # scripts/ is on sys.path via tests/conftest.py


def test_tiny_run_prints_each_estimators_theta_and_writes_the_plot(tmp_path, capsys):
    out = tmp_path / "plots" / "ib.png"
    influence_balancing.main(["--particles", "8", "--steps", "3", "--lr", "1e-3", "--out", str(out)])
    printed = capsys.readouterr().out
    finals = dict(re.findall(r"^(\w+)\s+final θ = +(-?[\d.]+)$", printed, flags=re.M))
    assert set(finals) == {"TruncatedPES", "NoiseReuseES", "TruncatedES", "TruncatedGrad"}
    assert all(float(v) != 0.5 for v in finals.values())  # θ₀ = 0.5 moved in 3 steps
    assert out.stat().st_size > 1000 and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

"""Smoke test of scripts/benchmark_distributed.py: one tiny configuration, numbers that make sense."""
import re

import pytest

import benchmark_distributed  # scripts/ is on sys.path via tests/conftest.py


@pytest.mark.xdist_group("ray")  # it starts a local Ray instance: on the worker of the other Ray tests
def test_benchmark_distributed_smoke(capsys):
    benchmark_distributed.main(["--problems", "a", "--workers", "1", "--steps", "2", "--warmup", "1"])
    out = capsys.readouterr().out
    rows = [l for l in out.splitlines() if l.startswith("| quadratic dim 10 |")]
    assert [r.split("|")[2].strip() for r in rows] == ["local", "Ray, 1 worker"]
    for r in rows:
        cells = [c.strip() for c in r.split("|")[3:-1]]
        est_s, inner_s, worker_ms = float(cells[0]), float(cells[1].replace(",", "")), float(cells[2])
        assert est_s > 0 and worker_ms > 0
        assert abs(inner_s - 800 * est_s) <= 0.01 * inner_s + 1  # 8 tasks x 50 steps x 2 antithetic halves
    sizes = dict(re.findall(r"^\| (\w+) \| (\d+) \|", out, flags=re.M))
    assert sizes == {"MLPLOpt": "1858", "AdafacMLPLOpt": "197"}

"""scripts/benchmark_distributed.py: the local run's figures (fast tier) and one tiny configuration of the
whole benchmark, Ray included (slow tier: it starts a local Ray instance)."""
import re

import pytest

import benchmark_distributed  # scripts/ is on sys.path via tests/conftest.py


def test_local_run_times_the_estimate_and_the_learners_step():
    """The local row without Ray: estimates per second is 1 / (step time), the step's overhead is what the
    learner adds after the estimate, all positive and finite."""
    r = benchmark_distributed.bench_local("a", steps=2, warmup=1)
    assert set(r) == {"est_s", "worker_ms", "overhead_ms", "step_overhead_ms"}
    assert r["est_s"] > 0 and r["worker_ms"] > 0 and r["overhead_ms"] == 0.0 and r["step_overhead_ms"] >= 0
    assert 1e3 / r["est_s"] >= r["worker_ms"]  # a step is its estimate plus the learner's update


@pytest.mark.slow
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

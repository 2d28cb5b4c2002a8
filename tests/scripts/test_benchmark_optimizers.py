"""scripts/benchmark_optimizers.py: the FLOP count its MLPLOpt floor is built on, its two timings and
the choice of the GEMM floor's block."""
import benchmark_optimizers as bo  # scripts/ is on sys.path via conftest

import lopt


def test_mlp_lopt_macs():
    assert bo.mlp_lopt_macs(lopt.MLPLOpt()) == 11 * 32 + 32 * 32 + 2 * 32


def test_bench_size_times_update_and_donated_step(monkeypatch):
    """Both measures run for every optimizer on a tiny model (the donated step carries its state
    from call to call) and come back positive, with the state size per parameter."""
    two = dict(list(bo.optimizers().items())[:2])
    monkeypatch.setattr(bo, "optimizers", lambda: two)
    n, res = bo.bench_size((6, 5, 3), repeats=2)
    assert n == 6 * 5 + 5 + 5 * 3 + 3
    assert list(res) == ["optax.adam", "MLPLOpt"]
    for t in res.values():
        assert t.update_s > 0 and t.step_s > 0
    assert res["optax.adam"].state_bytes == 8.0 + 4 / n  # m and v, float32, and the int32 count


def test_best_gemm_floor_picks_the_fastest_block(monkeypatch):
    times = {16: 3.0, 32: 1.0, 64: 2.0}
    monkeypatch.setattr(bo, "gemm_floor_s", lambda lo, n, repeats: (times[lo.block_size], 1e9 / times[lo.block_size]))
    assert bo.best_gemm_floor(lopt.MLPLOpt(), 100, blocks=(16, 32, 64)) == (32, 1.0, 1e9)

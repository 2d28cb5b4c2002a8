"""scripts/benchmark_optimizers.py: the FLOP count its MLPLOpt floor is built on, its two timings and
the choice of the GEMM floor's block."""
import benchmark_optimizers as bo  # scripts/ is on sys.path via conftest

import jax
import numpy as np

import lopt


def test_mlp_lopt_macs():
    assert bo.mlp_lopt_macs(lopt.MLPLOpt()) == 11 * 32 + 32 * 32 + 2 * 32


def test_bench_size_times_update_donated_step_and_floors(monkeypatch):
    """Both measures run for every optimizer on a tiny model (the donated step carries its state
    from call to call) and come back positive, with the state size per parameter; the GEMM floor
    is timed at each block asked for."""
    every = bo.optimizers()
    assert {"optax.adam", "optax.contrib.muon", "Celo2LOpt", "pretrained:normmlp_v3",
            "pretrained:celo2_v4", "pretrained:celo2_v7"} <= set(every)
    two = {k: v for k, v in every.items() if k in ("optax.adam", "MLPLOpt")}
    monkeypatch.setattr(bo, "optimizers", lambda: two)
    n, res, floors = bo.bench_size((6, 5, 3), repeats=2, floor_blocks=(8, 16))
    assert n == 6 * 5 + 5 + 5 * 3 + 3
    assert list(res) == ["optax.adam", "MLPLOpt"]
    for t in res.values():
        assert t.update_s > 0 and t.step_s > 0
    assert res["optax.adam"].state_bytes == 8.0 + 4 / n  # m and v, float32, and the int32 count
    assert sorted(floors) == [8, 16] and min(floors.values()) > 0


def test_gemm_floor_call_computes_the_three_gemms_in_place():
    """The floor's output is W3 (W2 (W1 x)) of its input over every block (the last one
    overlapping), and the donated output is carried from call to call."""
    lo = lopt.MLPLOpt(hidden_size=4, chunk_size=16)
    call = bo.gemm_floor_call(lo, 40)
    out = np.asarray(call())  # a copy: the next call donates the buffer
    ks = jax.random.split(jax.random.key(0), 4)  # the floor's inputs, as it draws them
    x = jax.random.normal(ks[0], (lo.num_features, 40))
    w1, wh, w3 = (jax.random.normal(k, s) for k, s in zip(ks[1:], [(4, lo.num_features), (4, 4), (2, 4)]))
    np.testing.assert_allclose(out, w3 @ (wh @ (w1 @ x)), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(call(), out)


def test_best_gemm_floor_picks_the_fastest_block():
    lo = lopt.MLPLOpt()
    block, s, flops = bo.best_gemm_floor(lo, 100, {16: 3.0, 32: 1.0, 64: 2.0})
    assert (block, s) == (32, 1.0) and flops == 2 * bo.mlp_lopt_macs(lo) * 100 / 1.0


def test_render_names_the_machine_and_takes_a_title():
    """The section starts with the heading asked for and names the device JAX computes on; the
    Celo2LOpt ÷ Muon table has a column per Celo2 optimizer that was timed."""
    t = bo.Timing(update_s=2e-3, step_s=1e-3, state_bytes=8.0)
    res = {name: t for name in ["optax.adam", "optax.contrib.muon", "MLPLOpt", "AdafacMLPLOpt", "Celo2LOpt",
                                "pretrained:celo2_v4"]}
    section = bo.render({"1M": (10, res)}, 1e9, 3, "", title="## Optimizer step (GPU)")
    assert section.startswith("## Optimizer step (GPU)\n") and f"Machine: {bo.machine()};" in section
    assert bo.machine().endswith(f"jax {jax.__version__}") and "CPU cores" in bo.machine()
    assert "| 1M | 1.00 / 1.00 | 1.00 / 1.00 |" in section
    res["pretrained:celo2_v7"] = bo.Timing(update_s=4e-3, step_s=3e-3, state_bytes=8.0)
    with_v7 = bo.render({"1M": (10, res)}, 1e9, 3, "")
    assert "pretrained:celo2_v7 ÷ optax.contrib.muon" in with_v7 and "| 1M | 1.00 / 1.00 | 1.00 / 1.00 | 2.00 / 3.00 |" in with_v7

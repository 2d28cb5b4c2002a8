"""scripts/benchmark_torch.py at a tiny size: every optimizer timed, the markdown table printed."""
import pytest

torch = pytest.importorskip("torch", reason='PyTorch is not installed: pip install -e ".[torch]"')

import benchmark_torch as bt  # noqa: E402  (scripts/ is on sys.path via conftest)


def test_build_model_is_torch_linear_layers_with_gradients():
    params = list(bt.build_model((6, 5, 3)).parameters())
    assert [tuple(p.shape) for p in params] == [(5, 6), (5,), (3, 5), (3,)]
    assert all(p.grad is not None and p.grad.shape == p.shape for p in params)


def test_bench_size_times_every_optimizer():
    n, res = bt.bench_size((6, 5, 3), repeats=2, warmup=1)
    assert n == 6 * 5 + 5 + 5 * 3 + 3
    assert list(res)[0] == "torch.optim.AdamW" and all(f"lopt.torch {name}" in res for name in bt.SHIPPED)
    for seconds, state in res.values():
        assert seconds > 0 and state > 0
    assert res["torch.optim.AdamW"][1] == pytest.approx(8.0 + 4 * 4 / n)  # m, v and a float32 step per tensor
    if "Muon + AdamW" in res:  # Muon: one momentum per matrix; AdamW: m, v and a step for the biases
        assert res["Muon + AdamW"][1] == pytest.approx((4 * 45 + 8 * 8 + 4 * 2) / n)
    assert res["lopt.torch normmlp_v3"][1] > 20.0  # four momenta and v, float32, plus per-tensor scalars
    assert res["lopt.torch celo2_v5"][1] > 12.0  # three momenta (its hidden-matrix path) and v, plus scalars


def test_main_prints_a_markdown_table(capsys):
    table = bt.main(["--widths", "8,4,2", "--repeats", "2", "--warmup", "1", "--threads", "1"])
    out = capsys.readouterr().out
    assert table in out
    rows = [line for line in table.splitlines() if line.startswith("| custom |")]
    assert len(rows) == len(bt.optimizers("cpu"))
    assert rows[0].split("|")[5].strip() == "1.00x"

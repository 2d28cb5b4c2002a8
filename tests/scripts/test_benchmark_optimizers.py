"""scripts/benchmark_optimizers.py: the FLOP count its MLPLOpt floor is built on."""
import benchmark_optimizers as bo  # scripts/ is on sys.path via conftest

import lopt


def test_mlp_lopt_macs():
    assert bo.mlp_lopt_macs(lopt.MLPLOpt()) == 11 * 32 + 32 * 32 + 2 * 32

"""scripts/benchmark_optimizers.py only replaces its own section of docs/benchmarks.md."""
import benchmark_optimizers as bo


def test_replace_section_keeps_other_sections():
    doc = "# Benchmarks\n\n## Estimators\n\nfast\n\n## Optimizer step\n\nold table\n\n## Tasks\n\nx\n"
    out = bo.replace_section(doc, "## Optimizer step\n\nnew table\n")
    assert "## Estimators\n\nfast" in out and "## Tasks\n\nx" in out
    assert "new table" in out and "old table" not in out
    assert out.index("## Estimators") < out.index("new table") < out.index("## Tasks")


def test_replace_section_appends_when_missing():
    assert bo.replace_section("", "## Optimizer step\n\nt\n").startswith("# Benchmarks\n\n## Optimizer step")
    out = bo.replace_section("# Benchmarks\n\n## Estimators\n\nfast\n", "## Optimizer step\n\nt\n")
    assert out.endswith("## Optimizer step\n\nt\n") and "fast" in out


def test_mlp_lopt_macs():
    import lopt
    assert bo.mlp_lopt_macs(lopt.MLPLOpt()) == 11 * 32 + 32 * 32 + 2 * 32

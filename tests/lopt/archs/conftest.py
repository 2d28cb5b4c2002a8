"""Which architecture-contract cases are the slow tier (CONTRIBUTING.md, "Run the tests").

The contract of test_architectures.py runs every check on every architecture. Its most expensive checks
(gradients through a 10-step unroll, vmap over theta, block-size equivalences, the donated step, save/load,
optax chains) compile the whole update several times; for the architectures with the largest updates
(AdafacMLPLOpt, Celo2LOpt, HyperLOpt, NormMLPLOpt, RNNMLPLOpt: minutes on 2 cores together) they are
the slow tier. Their cheaper
checks (shapes, dtypes, refusals) and every check on the other architectures stay in the fast tier, so
every check's code and every architecture's module run there.
"""
import pytest

HEAVY_ARCHS = {"AdafacMLPLOpt", "Celo2LOpt", "HyperLOpt", "NormMLPLOpt", "RNNMLPLOpt"}
HEAVY_CHECKS = {"test_grad_through_10_step_unroll_with_traced_num_steps", "test_vmap_over_theta",
                "test_blockwise_sums_do_not_change_updates", "test_accelerator_blocks_do_not_change_updates",
                "test_donated_train_step_updates_the_state_in_place", "test_save_load_same_updates",
                "test_inside_optax_chain_with_clipping_and_multisteps"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name != "test_architectures.py" or item.originalname not in HEAVY_CHECKS:
            continue
        if getattr(item, "callspec", None) and item.callspec.params.get("arch") in HEAVY_ARCHS:
            item.add_marker(pytest.mark.slow)

"""The Muon and AdamW baselines: Muon's parameter routing and update, and both tuned over their grids."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from optax.contrib import MuonDimensionNumbers

import tasks
from outer_trainers.evaluation import protocol, task_draws


def test_muon_routes_weight_matrices_and_kernels_and_leaves_the_rest_to_adam():
    params = {"linear": {"w": jnp.ones((6, 4)), "b": jnp.ones(4)}, "conv_nd": {"w": jnp.ones((3, 3, 2, 5))},
              "conv1d": {"w": jnp.ones((5, 2, 3))}, "embed": {"embeddings": jnp.ones((16, 4))},
              "~": {"pos_embed": jnp.ones((7, 4))}, "layer_norm": {"scale": jnp.ones(4)}, "s": jnp.ones(())}
    dims = protocol.muon_dimension_numbers(params)
    is_dims = lambda x: x is None or isinstance(x, MuonDimensionNumbers)
    assert dims["linear"]["w"] == MuonDimensionNumbers((0,), 1)
    assert dims["conv_nd"]["w"] == MuonDimensionNumbers((0, 1, 2), 3)  # [k*k*in, out]
    assert dims["conv1d"]["w"] == MuonDimensionNumbers((0, 1), 2)
    assert [jax.tree_util.keystr(p) for p, d in jax.tree_util.tree_leaves_with_path(dims, is_leaf=is_dims)
            if d is None] == ["['embed']['embeddings']", "['layer_norm']['scale']", "['linear']['b']", "['s']",
                              "['~']['pos_embed']"]


def test_muon_orthogonalises_a_matrix_update_and_adam_steps_the_rest():
    rng = np.random.default_rng(0)

    def spread(rows, cols):  # a gradient with singular values 10, 3, 1, 0.1
        u, _ = np.linalg.qr(rng.standard_normal((rows, cols)))
        v, _ = np.linalg.qr(rng.standard_normal((cols, cols)))
        return jnp.asarray(u @ np.diag([10.0, 3.0, 1.0, 0.1]) @ v.T, jnp.float32)

    params = {"w": jnp.zeros((8, 4)), "k": jnp.zeros((3, 2, 4)), "b": jnp.zeros(4)}
    grads = {"w": spread(8, 4), "k": spread(6, 4).reshape(3, 2, 4), "b": jnp.asarray([1.0, -2.0, 0.5, -0.1])}
    tx = protocol.baseline("muon")(0.1)
    updates, _ = tx.update(grads, tx.init(params), params)
    # Newton-Schulz (5 quintic steps) maps singular values 10 .. 0.1 into a band around 1, times lr (fan_out <
    # fan_in: optax's width scale is 1); a conv kernel [3, 2, 4] is orthogonalised as the [6, 4] matrix
    for name, shape in (("w", (8, 4)), ("k", (6, 4))):
        sv = np.linalg.svd(np.asarray(updates[name]).reshape(shape), compute_uv=False) / 0.1
        assert 0.6 < sv.min() and sv.max() < 1.25, (name, sv)
    # the bias takes Nesterov Adam's (optax.adamw(nesterov=True), no decay) first step at the same rate:
    # -lr * (1 + b1 (1 - b1) / (1 - b1^2)) * sign(g)
    np.testing.assert_allclose(updates["b"], -0.1 * (1 + 0.9 * 0.1 / 0.19) * np.sign(grads["b"]), rtol=1e-4)


@pytest.mark.parametrize("name", [pytest.param("muon", marks=pytest.mark.slow), "adamw"])  # the same grid code
def test_muon_and_adamw_tuned_over_their_grids_pick_a_rate_inside_it(name):
    fam = tasks.ImageMLPFamily("digits", (16,), batch_size=32, init_scale_range=(1.0, 1.0), activations=("tanh",))
    cfgs, keys = task_draws(fam, (0, 1))
    lrs = protocol.default_lrs(name)
    runs = protocol.tune_learning_rate(fam, name, protocol.baseline(name), lrs, cfgs, keys, 40)
    tried = [r["learning_rate"] for r in runs]
    assert len(tried) >= 7 and all(np.isclose(tried, lr).any() for lr in lrs)  # the 7-point grid, perhaps extended
    best = protocol.best_runs(runs)[name]
    # inside the grid tried (extended past an edge if need be)
    assert tried[0] < best["learning_rate"] < tried[-1] and protocol.grid_edge(runs, name) is None
    valids = {r["learning_rate"]: np.median(r["valids"]) for r in runs}  # chosen on validation loss
    assert valids[best["learning_rate"]] == min(valids.values())
    assert np.median(protocol.final_loss(best["losses"])) < 0.5 * np.median(best["losses"][:, 0])  # it trains

"""Shared checks for every Task / TaskFamily: finite init/loss/grad under vmap over sampled
configs, no recompilation across per-task values, normaliser near 1 for untrained tasks.

Compile time dominates on CPU (a vmapped threefry key costs seconds), so the per-task function
vmaps over configs with one shared key, and configs are sampled eagerly (those tiny kernels are
cached across families)."""
import jax
import jax.numpy as jnp
import numpy as np

NUM_TASKS = 4


def _per_task(family):
    def one(cfg, key, data):
        task = family.task_fn(cfg)
        k_init, k_batch, k_loss = jax.random.split(key, 3)
        params, state = task.init_with_state(k_init)
        batch = data.batch(k_batch, "train") if data is not None else None
        (loss, _), grads = jax.value_and_grad(task.loss_with_state, has_aux=True)(params, state, k_loss, batch)
        return loss, task.normalizer(loss), grads

    return jax.jit(jax.vmap(one, in_axes=(0, None, None)))


def check_family(family, compile_counter, norm_range=(0.1, 5.0), mean_norm_range=(0.4, 2.5)):
    """Runs the shared checks; returns (losses, normalised losses) of the first call."""
    sample = jax.vmap(family.sample)
    run = _per_task(family)
    cfg_a = sample(jax.random.split(jax.random.key(0), NUM_TASKS))
    out_a = run(cfg_a, jax.random.key(1), family.data)
    cfg_b = sample(jax.random.split(jax.random.key(2), NUM_TASKS))
    with compile_counter() as c:
        out_b = run(cfg_b, jax.random.key(3), family.data)
        jax.block_until_ready(out_b)
    assert c.count == 0, f"{family.name}: {c.count} recompilations for new per-task values"
    for loss, norm, grads in (out_a, out_b):
        assert loss.shape == (NUM_TASKS,)
        assert np.all(np.isfinite(loss)), f"{family.name}: non-finite loss {loss}"
        for g in jax.tree_util.tree_leaves(grads):
            assert g.shape[0] == NUM_TASKS and np.all(np.isfinite(g)), f"{family.name}: non-finite grads"
        assert any(float(jnp.max(jnp.abs(g))) > 0 for g in jax.tree_util.tree_leaves(grads)), "all-zero grads"
        lo, hi = norm_range
        assert np.all((norm > lo) & (norm < hi)), f"{family.name}: normalised untrained losses {norm}"
        assert mean_norm_range[0] < float(np.mean(norm)) < mean_norm_range[1], f"{family.name}: {norm}"
    return out_a[0], out_a[1]

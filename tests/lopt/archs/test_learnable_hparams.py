"""Hand-designed optimizers with learnable hyper-parameters match optax; NNAdam reduces to Adam."""
import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

import lopt


def _params():
    return {"w": jnp.linspace(-1.0, 1.0, 12).reshape(3, 4), "b": jnp.ones((4,))}


def _run(tx, n=5):
    params = _params()

    @jax.jit
    def go(params):
        state = tx.init(params)
        for i in range(n):
            g = jax.tree_util.tree_map(lambda p: jnp.cos(p * (i + 1)), params)
            u, state = tx.update(g, state, params)
            params = optax.apply_updates(params, u)
        return params
    return go(params)


def _tx(lo):
    return lo.opt_fn(lo.init(jax.random.key(0)))


def test_learnable_adam_defaults_match_optax_adam():
    chex.assert_trees_all_close(_run(_tx(lopt.LearnableAdam())), _run(optax.adam(1e-3)), rtol=1e-6, atol=1e-7)


def test_learnable_sgd_and_sgdm_match_optax_sgd():
    chex.assert_trees_all_close(_run(_tx(lopt.LearnableSGD(0.05))), _run(optax.sgd(0.05)), rtol=1e-6, atol=1e-7)
    chex.assert_trees_all_close(_run(_tx(lopt.LearnableSGDM(0.05, 0.8))), _run(optax.sgd(0.05, momentum=0.8)),
                                rtol=1e-6, atol=1e-7)


def test_nn_adam_with_zero_head_is_adam():
    lo = lopt.NNAdam(lstm_hidden=4)
    theta = lo.init(jax.random.key(0))
    theta["output"]["w"] = jnp.zeros_like(theta["output"]["w"])
    chex.assert_trees_all_close(_run(lo.opt_fn(theta)), _run(optax.adam(1e-3)), rtol=1e-5, atol=1e-7)


def test_flax_model_trained_50_steps_with_learnable_adam_lowers_loss():
    class Net(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(1)(nn.relu(nn.Dense(16)(x)))

    kx, ki = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, (64, 4))
    y = jnp.sin(x.sum(axis=1, keepdims=True))
    model = Net()
    params = model.init(ki, x)
    loss_fn = lambda p: jnp.mean(jnp.square(model.apply(p, x) - y))
    tx = _tx(lopt.LearnableAdam(learning_rate=1e-2))
    state = tx.init(params)

    @jax.jit
    def step(params, state):
        loss, g = jax.value_and_grad(loss_fn)(params)
        u, state = tx.update(g, state, params, loss=loss)
        return optax.apply_updates(params, u), state, loss

    first = float(loss_fn(params))
    for _ in range(50):
        params, state, _ = step(params, state)
    assert float(loss_fn(params)) < 0.5 * first

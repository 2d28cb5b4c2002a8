"""Adam for 200 steps (one jitted lax.scan per task) at least halves each image task's loss."""
import jax
import optax
import pytest

import tasks
from tests.conftest import requires_dataset


def _train(task, steps=200, lr=1e-2):
    data = task.data
    eval_data = data.with_batch_size(256)
    opt = optax.adam(lr)

    @jax.jit
    def run(key, data, eval_data):
        k_init, k_eval, k_steps = jax.random.split(key, 3)
        params, state = task.init_with_state(k_init)
        eval_batch = eval_data.batch(k_eval, "train")

        def step(carry, k):
            params, state, opt_state = carry
            (loss, state), g = jax.value_and_grad(task.loss_with_state, has_aux=True)(
                params, state, k, data.batch(k, "train"))
            updates, opt_state = opt.update(g, opt_state, params)
            return (optax.apply_updates(params, updates), state, opt_state), loss

        before = task.loss_with_state(params, state, k_eval, eval_batch)[0]
        (params, state, _), _ = jax.lax.scan(step, (params, state, opt.init(params)), jax.random.split(k_steps, steps))
        return before, task.loss_with_state(params, state, k_eval, eval_batch)[0]

    return [float(x) for x in run(jax.random.key(0), data, eval_data)]


IMAGE_TASKS = {
    "mlp_digits": lambda: tasks.ImageMLPTask("digits", (32,), batch_size=32),
    "mlp_digits_layernorm": lambda: tasks.ImageMLPTask("digits", (32, 32), batch_size=32, norm="layer"),
    "mlp_digits_batchnorm": lambda: tasks.ImageMLPTask("digits", (32,), batch_size=32, norm="batch"),
    "conv_digits": lambda: tasks.ConvTask("digits", (8, 16), batch_size=32),
    "conv_signals1d": lambda: tasks.ConvTask("signals1d", (16, 32), batch_size=32),
    "mlp_signals1d": lambda: tasks.ImageMLPTask("signals1d", (64,), batch_size=32),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(IMAGE_TASKS))
def test_adam_halves_image_task_loss(name):
    before, after = _train(IMAGE_TASKS[name]())
    assert after < 0.5 * before, f"{name}: {before:.3f} -> {after:.3f}"


@pytest.mark.slow
@requires_dataset("fashion_mnist")
def test_adam_halves_fashion_mnist_mlp_loss():
    before, after = _train(tasks.ImageMLPTask("fashion_mnist", (32,), batch_size=32), lr=3e-3)
    assert after < 0.5 * before, f"{before:.3f} -> {after:.3f}"

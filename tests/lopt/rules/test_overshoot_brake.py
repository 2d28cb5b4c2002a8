"""lopt.rules.overshoot_brake: the brake's step by hand, its bounds, and around a plain optax optimizer."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lopt.rules.overshoot_brake import FLOOR, OvershootBrakeState, brake_step, overshoot_brake


def test_brake_step_by_hand():
    """log α_t = clip(log α_{t−1} − κ (c_t − c₀), log floor, 0), c_t = cos(g_t, Δp_{t−1}) over all leaves."""
    g = [jnp.asarray([1.0, 2.0]), jnp.asarray([[2.0]])]
    down = [jnp.asarray([-2.0, -4.0]), jnp.asarray([[-4.0]])]                 # c = −1: the last step went downhill
    np.testing.assert_allclose(brake_step(jnp.asarray(-1.0), g, down, 0.5, 0.15), -1.0 + 0.5 * 1.15, rtol=1e-6)
    np.testing.assert_allclose(brake_step(jnp.asarray(-0.1), g, down, 0.5, 0.15), 0.0)        # never above α = 1
    up = [-d for d in down]                                                   # c = +1: it overshot
    np.testing.assert_allclose(brake_step(jnp.asarray(-1.0), g, up, 0.5, 0.15), -1.0 - 0.5 * 0.85, rtol=1e-6)
    np.testing.assert_allclose(brake_step(jnp.asarray(-4.5), g, up, 0.5, 0.15), np.log(FLOOR), rtol=1e-6)
    np.testing.assert_allclose(brake_step(jnp.asarray(0.0), g, [jnp.zeros(2), jnp.zeros((1, 1))], 0.5, 0.15), 0.0)
    half = [jnp.asarray([2.0, -1.0]), jnp.asarray([[0.0]])]                   # orthogonal: c = 0
    np.testing.assert_allclose(brake_step(jnp.asarray(-1.0), g, half, 0.5, 0.15), -1.0 + 0.5 * 0.15, rtol=1e-6)


def test_brakes_diverging_sgd_and_leaves_small_adam_steps_exact():
    """On ½ c x² SGD just above its stable rate (2/c_max) diverges; braked, it converges. Around optax.adam at a small
    lr (no overshoot) every update equals Adam's, bit for bit."""
    loss_fn = lambda p: 0.5 * jnp.sum(jnp.logspace(0, 2, 16) * p["x"] ** 2)

    def run(tx, steps=300):
        p = {"x": jnp.ones(16)}

        def step(carry, _):
            p, s = carry
            g = jax.grad(loss_fn)(p)
            u, s = tx.update(g, s, p)
            return (optax.apply_updates(p, u), s), (loss_fn(p), u["x"])

        return jax.jit(lambda c: jax.lax.scan(step, c, None, length=steps))((p, tx.init(p)))[1]

    big, big_braked = run(optax.sgd(0.021)), run(overshoot_brake(optax.sgd(0.021), gain=0.5))  # above 2/c_max = 0.02
    assert float(big[0][-1]) > 1e3 and float(big_braked[0][-1]) < 1e-3
    small, small_braked = run(optax.adam(1e-3)), run(overshoot_brake(optax.adam(1e-3), gain=0.5))
    np.testing.assert_array_equal(small[1], small_braked[1])
    state = overshoot_brake(optax.adam(1e-3), gain=0.5).init({"x": jnp.ones(3)})
    assert isinstance(state, OvershootBrakeState) and float(state.log_brake) == 0.0
    with pytest.raises(ValueError, match="gain > 0"):
        overshoot_brake(optax.adam(1e-3), gain=0.0)

"""The no-growth rule's math: the part of the residual that would grow ‖p‖ is projected out, the rest kept."""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np

from lopt.rules import radial


def _pair(seed=0, shape=(6, 5)):
    kr, kp = jax.random.split(jax.random.key(seed))
    return jax.random.normal(kr, shape), jax.random.normal(kp, shape)


def test_growing_component_is_projected_out():
    """⟨r, p⟩ < 0 (the step −η r grows ‖p‖): the result is orthogonal to p and differs from r along p only."""
    r, p = _pair()
    r = r - 2.0 * p * (jnp.sum(r * p) / jnp.sum(p * p) + 1.0)  # make ⟨r, p⟩ clearly negative
    assert float(jnp.sum(r * p)) < -1.0
    out = radial.remove_growth(r, p)
    np.testing.assert_allclose(float(jnp.sum(out * p)), 0.0, atol=1e-4)
    coef = float(jnp.sum(r * p) / jnp.sum(p * p))
    chex.assert_trees_all_close(out, r - coef * p, rtol=1e-5, atol=1e-6)


def test_shrinking_residual_is_unchanged_bit_for_bit():
    r, p = _pair(1)
    r = r + 2.0 * p * (abs(float(jnp.sum(r * p) / jnp.sum(p * p))) + 1.0)  # ⟨r, p⟩ > 0
    assert float(jnp.sum(r * p)) > 0
    chex.assert_trees_all_equal(radial.remove_growth(r, p), r)


def test_zero_parameter_leaves_the_residual_and_shapes_may_differ():
    r, _ = _pair(2)
    chex.assert_trees_all_equal(radial.remove_growth(r, jnp.zeros((30,))), r)
    r_flat, p = jnp.reshape(r, (30,)), -jnp.reshape(r, (6, 5))  # flat residual, parameter in its own shape
    out = radial.remove_growth(r_flat, p)
    assert out.shape == (30,)
    np.testing.assert_allclose(np.asarray(out), 0.0, atol=1e-6)  # r = −p: all of it grows ‖p‖


def test_the_step_no_longer_grows_the_norm_to_first_order():
    """d‖p − ε r'‖²/dε at 0 is −2⟨r', p⟩ ≤ 0 for any r: the step along −r' cannot grow ‖p‖ to first order."""
    for seed in range(5):
        r, p = _pair(seed + 10)
        out = radial.remove_growth(r, p)
        assert float(jnp.sum(out * p)) >= -1e-4


def test_free_scale_leaves_matrices_below_it_alone():
    """With g > 0 the rule acts only where rms(p) · √fan_in > g."""
    r, p = _pair(3, (16, 4))
    r = r - 3.0 * p  # clearly growing
    fan_in = 16
    unit = p / jnp.sqrt(jnp.mean(p * p) * fan_in)  # rms(unit) · √fan_in = 1 (LeCun's scale)
    chex.assert_trees_all_equal(radial.remove_growth(r, 1.5 * unit, free=2.0, fan_in=fan_in), r)
    chex.assert_trees_all_close(radial.remove_growth(r, 2.5 * unit, free=2.0, fan_in=fan_in),
                                radial.remove_growth(r, 2.5 * unit), rtol=1e-6)
    assert not np.allclose(radial.remove_growth(r, 2.5 * unit), r)

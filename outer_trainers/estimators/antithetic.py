"""Antithetic pairs: what the ES estimators (TruncatedES, TruncatedPES, NoiseReuseES, FullES) share.

Pair i runs θ + ε_i and θ − ε_i, ε_i ~ N(0, σ²I). The 2N particles are stacked on one axis,
+ half first ([θ + ε ; θ − ε]), so one vmapped step advances them all; the two halves of a
pair share their step keys (same data, same resets: a reset group of 2), which is what makes
their loss difference low-variance. From the step losses ℓ±_it the estimators form

    Δ_it = ℓ⁺_it − ℓ⁻_it   where both halves' steps count (masks m⁺_it ∧ m⁻_it), else 0
    ĝ    = Σ_i w_i ε_i     with weights w_i built from the Δ_it, e.g. Σ_t Δ_it / (2σ² K N)

(the weighted sum is `tree_utils.tree_weighted_sum`).
"""
from __future__ import annotations

from typing import Any

import jax
import jax.flatten_util
import jax.numpy as jnp


def sample_perturbations(theta: Any, key: jax.Array, num: int, std: float) -> Any:
    """ε ~ N(0, std² I) shaped like theta with a leading [num] axis.

    One normal draw over the flattened theta (not one per leaf): every random-bits call site
    is a separate threefry kernel for XLA to compile.

    Args:
        theta: the meta-parameters, a pytree.
        key: PRNG key.
        num: N, the number of perturbations.
        std: σ.

    Returns:
        A pytree like theta with leaves [N, ...].
    """
    flat, unravel = jax.flatten_util.ravel_pytree(theta)
    eps = std * jax.random.normal(key, (num,) + flat.shape, flat.dtype)
    return jax.vmap(unravel)(eps)


def tree_stack_pm(theta: Any, eps: Any) -> Any:
    """[θ + ε ; θ − ε]: the 2N perturbed meta-parameters of N pairs, + half first.

    Args:
        theta: the meta-parameters, a pytree.
        eps: perturbations like theta with leaves [N, ...].

    Returns:
        A pytree like theta with leaves [2N, ...].
    """
    return jax.tree_util.tree_map(lambda t, e: jnp.concatenate([t + e, t - e], axis=0), theta, eps)


def pair_valid(mask: jax.Array) -> jax.Array:
    """Whether both halves of each pair count: m⁺ ∧ m⁻.

    Args:
        mask: bool [..., 2N], which losses count (+ halves first on the last axis).

    Returns:
        bool [..., N].
    """
    n = mask.shape[-1] // 2
    return mask[..., :n] & mask[..., n:]


def pair_loss_diff(loss: jax.Array, mask: jax.Array) -> jax.Array:
    """Δ = ℓ⁺ − ℓ⁻ of every pair, 0 where either half's loss does not count.

    Args:
        loss: float [..., 2N], losses of the + half then the − half on the last axis.
        mask: bool [..., 2N], which losses count.

    Returns:
        float [..., N].
    """
    n = loss.shape[-1] // 2
    return jnp.where(pair_valid(mask), loss[..., :n] - loss[..., n:], 0.0)


def counted_steps(mask: jax.Array) -> jax.Array:
    """The particle steps that enter an antithetic estimate: 2 × the pair steps whose halves both count.

    Args:
        mask: bool [..., 2N], which losses count (+ halves first on the last axis).

    Returns:
        int32 [], Σ 2 · (m⁺ ∧ m⁻); `mask.size` when every step counts.
    """
    return 2 * jnp.sum(pair_valid(mask), dtype=jnp.int32)


def pair_is_done(is_done: jax.Array) -> jax.Array:
    """Whether either half of each pair ended its episode: d⁺ ∨ d⁻.

    Args:
        is_done: bool [..., 2N], whether each particle's episode ended (+ halves first on the last axis).

    Returns:
        bool [..., N].
    """
    n = is_done.shape[-1] // 2
    return is_done[..., :n] | is_done[..., n:]

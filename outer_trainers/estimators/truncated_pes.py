"""TruncatedPES: persistent evolution strategies (Vicol, Metz, Sohl-Dickstein, ICML 2021).

Each pair i keeps ξ_i, the sum of the perturbations applied since its episode began, and
separate + and − inner states. Per truncation with fresh ε_i and K steps of meta-losses ℓ±_it:

    ĝ = mean_i Σ_t (ℓ⁺_it − ℓ⁻_it) · a_it / (2σ² K),
    a_it = ξ_i + ε_i   if the episode has not reset before step t in this truncation,
         = ε_i         otherwise (the new episode has seen only ε_i).

Afterwards ξ_i ← ξ_i + ε_i with no reset, ε_i after a reset inside the truncation, and 0 when the
reset came with the truncation's last step. The estimate is unbiased for the gradient of the
Gaussian-smoothed loss of the whole episode's steps in this truncation.

With several local devices (e.g. one XLA CPU device per core, `outer_trainers.use_all_cpu_cores`)
the N pairs are sharded over them by default (`sharded_truncation`): each device unrolls N/D
pairs, one `psum` per truncation adds their terms. Perturbations and step keys are drawn as on
one device, so the estimate equals the one-device estimate up to float summation order.
"""
from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
from flax import struct
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from outer_trainers import devices as D
from outer_trainers.steps import unroll as U
from outer_trainers.estimators import antithetic as A
from outer_trainers.estimators.gradient_estimator import AntitheticTruncatedEstimator, Estimate, counted_estimate
from outer_trainers.tree_utils import tree_weighted_sum
from outer_trainers.steps.truncated_step import StepOut


@struct.dataclass
class PESState:
    """TruncatedPES's state between truncations.

    Attributes:
        inner_state: the 2N particles' states, leaves [2N, ...]: the + halves, then the − halves.
        accumulator: ξ, θ-shaped with a leading [N] axis.
    """

    inner_state: object
    accumulator: object


def pes_weights(diff: jax.Array, done: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """The coefficients of one truncation's PES estimate and accumulator update.

    With r_it = "pair i reset before step t in this truncation":
    ĝ ∝ Σ_i (w_eps_i ε_i + w_acc_i ξ_i),  w_eps_i = Σ_t Δ_it,  w_acc_i = Σ_{t: not r_it} Δ_it;
    ξ_i ← keep_eps_i ε_i + keep_acc_i ξ_i,  keep_eps_i = [no reset at the last step],
    keep_acc_i = [no reset in the truncation].

    Args:
        diff: float [K, N], the pairs' per-step loss differences Δ_it.
        done: bool [K, N], whether pair i's episode ended with step t.

    Returns:
        (w_eps, w_acc, keep_eps, keep_acc), float [N] each.
    """
    reset_before = (jnp.cumsum(done, axis=0) - done) > 0
    w_eps = diff.sum(0)
    w_acc = jnp.where(reset_before, 0.0, diff).sum(0)
    keep_eps = (~done[-1]).astype(diff.dtype)
    keep_acc = (~jnp.any(done, axis=0)).astype(diff.dtype)
    return w_eps, w_acc, keep_eps, keep_acc


@struct.dataclass
class PESStats:
    """What one truncation of PES counts besides its gradient, summed over its steps and pairs.

    A pytree of float32 [] sums, so the shards of a sharded truncation add theirs with one
    `jax.lax.psum`, as they add their gradient terms. `stats_to_estimate` turns them into the
    Estimate's loss, counts and metrics.

    Attributes:
        loss_sum: the meta-losses of the unmasked steps, summed.
        unmasked_steps: the steps whose meta-loss was not masked out.
        nonfinite: the steps the truncated step reported non-finite (its "nonfinite" metric).
        resets: the pairs' episode ends.
        counted_steps: the steps that entered the estimate (`antithetic.counted_steps`: both
            halves of a pair unmasked).
        steps: the steps run (every particle's, both halves).
    """

    loss_sum: jax.Array
    unmasked_steps: jax.Array
    nonfinite: jax.Array
    resets: jax.Array
    counted_steps: jax.Array
    steps: jax.Array


def pes_update(out: StepOut, eps, acc, std: float, num_total: int):
    """PES from one truncation of M particle pairs (all N = num_total of them, or one shard).

    Args:
        out: the truncation's StepOut, leaves [K, 2M]: the + halves, then the − halves.
        eps: the pairs' perturbations ε, θ-shaped with a leading [M] axis.
        acc: their accumulators ξ, likewise.
        std: σ.
        num_total: N, the pairs over all shards.

    Returns:
        (grad, acc, stats): these pairs' terms of the estimate, each divided by 2σ²·K·N (so
        summing over the shards of the N pairs gives ĝ); the new accumulators ξ [M]; and these
        pairs' `PESStats`.
    """
    K = out.loss.shape[0]
    diff = A.pair_loss_diff(out.loss, out.mask)
    done = A.pair_is_done(out.is_done)
    w_eps, w_acc, keep_eps, keep_acc = pes_weights(diff, done)
    c = 1.0 / (2 * std**2 * K * num_total)
    grad = jax.tree_util.tree_map(jnp.add, tree_weighted_sum(w_eps * c, eps), tree_weighted_sum(w_acc * c, acc))
    bshape = lambda w, x: jnp.reshape(w, w.shape + (1,) * (x.ndim - 1))
    new_acc = jax.tree_util.tree_map(lambda e, a: bshape(keep_eps, e) * e + bshape(keep_acc, a) * a, eps, acc)
    f32 = lambda x: jnp.asarray(x).astype(jnp.float32)
    stats = PESStats(loss_sum=f32(jnp.sum(jnp.where(out.mask, out.loss, 0.0))),
                     unmasked_steps=f32(jnp.sum(out.mask)),
                     nonfinite=f32(jnp.sum(jnp.asarray(out.metrics.get("nonfinite", 0)))),
                     resets=f32(jnp.sum(done)),
                     counted_steps=f32(A.counted_steps(out.mask)),
                     steps=f32(out.mask.size))
    return grad, new_acc, stats


def stats_to_estimate(grad, stats: PESStats) -> Estimate:
    """The Estimate of `pes_update`'s (summed) grad and stats: loss = masked loss sum / unmasked steps.

    Args:
        grad: the θ-shaped estimate.
        stats: the truncation's `PESStats` (summed over shards).

    Returns:
        Estimate with `num_valid`, `num_steps` and metrics "nonfinite" and "resets" (int32).
    """
    metrics = {"nonfinite": stats.nonfinite.astype(jnp.int32), "resets": stats.resets.astype(jnp.int32)}
    loss = stats.loss_sum / jnp.maximum(stats.unmasked_steps, 1.0)
    return counted_estimate(grad, loss, stats.counted_steps, stats.steps, metrics)


def sharded_truncation(ts, mesh: Mesh, theta, inner, acc, eps, keys, std: float, *, outer_state=None, data=None):
    """One PES truncation with the N pairs sharded over the 1-D `mesh` (axis `devices.AXIS`).

    Each device unrolls its N/D pairs (their + and − halves side by side) with the given step
    keys, forms its terms of the estimate (`pes_update`), and one `psum` adds them.

    Args:
        ts: the TruncatedStep.
        mesh: the mesh of D devices; N must be a multiple of D.
        theta: the meta-parameters (replicated).
        inner: the pairs' states, leaves [2, N, ...] (+ halves, then − halves).
        acc: the accumulators ξ, θ-shaped with a leading [N] axis.
        eps: the perturbations ε, likewise.
        keys: [K, N] step keys (pair i's keys in column i, shared by its + and − halves).
        std: σ.
        outer_state: the outer iteration or None (replicated).
        data: the arrays of `ts.data_args()` or None (replicated).

    Returns:
        (inner [2, N, ...], acc [N, ...], grad, stats) as `pes_update` returns them, grad and
        stats (`PESStats`) summed over devices.
    """
    n = keys.shape[1]
    m = n // mesh.shape[D.AXIS]

    def local(theta, inner, acc, eps, keys, outer_state, data):
        states = jax.tree_util.tree_map(lambda x: x.reshape((2 * m,) + x.shape[2:]), inner)
        states, out = U.unroll_with_keys(ts, A.tree_stack_pm(theta, eps), states,
                                         jnp.concatenate([keys, keys], axis=1), outer_state=outer_state,
                                         data=data, reset_groups=2)
        grad, acc, stats = pes_update(out, eps, acc, std, n)
        grad, stats = jax.lax.psum((grad, stats), D.AXIS)
        inner = jax.tree_util.tree_map(lambda x: x.reshape((2, m) + x.shape[1:]), states)
        return inner, acc, grad, stats

    return jax.shard_map(
        local, mesh=mesh, in_specs=(P(), P(None, D.AXIS), P(D.AXIS), P(D.AXIS), P(None, D.AXIS), P(), P()),
        out_specs=(P(None, D.AXIS), P(D.AXIS), P(), P()))(theta, inner, acc, eps, keys, outer_state, data)


SHARD_MIN_SIZE = 2048  # elements of one particle's state below which num_devices=None stays on one device


def particle_size(inner_state) -> int:
    """Elements of one particle's state.

    Args:
        inner_state: the particles' states, leaves with a leading particle axis.

    Returns:
        The elements of one particle's share of the leaves (scalar leaves, carrying no particle
        axis, are left out).
    """
    return sum(int(x.size // max(x.shape[0], 1)) for x in jax.tree_util.tree_leaves(inner_state) if x.ndim)


class TruncatedPES(AntitheticTruncatedEstimator):
    """Persistent evolution strategies: unbiased across truncations (see the module docstring).

    Args:
        truncated_step: the unrolled system; each pair carries a + and a − state of it.
        num_tasks: N, the number of ± pairs, each with its accumulated perturbation ξ_i.
        trunc_length: K, the steps of one truncation (one `estimate`).
        std: σ of the fresh perturbations ε_i of every truncation.
        random_initial_iteration_offset: staggers the pairs' first episodes (see `TruncatedEstimator`).
        num_devices: shard the N pairs over this many local devices (`sharded_truncation`); None
            for as many as divide N (`devices.shard_count`: all of them when N is a multiple of
            their number, one when there is one device) unless a particle's state is smaller than
            `SHARD_MIN_SIZE` elements (a 10-dim quadratic runs slower sharded: its steps are too
            small to pay for the devices' synchronisation); 1 to stay on the default device.
        compiler_options: XLA compile options (see `GradientEstimator`).
    """

    def __init__(self, truncated_step, num_tasks: int, trunc_length: int, std: float = 0.01, *,
                 random_initial_iteration_offset: int = 0, num_devices: Optional[int] = None,
                 compiler_options: Optional[dict] = None):
        super().__init__(truncated_step, num_tasks, trunc_length, std,
                         random_initial_iteration_offset=random_initial_iteration_offset,
                         compiler_options=compiler_options)
        self.mesh = D.particle_mesh(self.num_tasks, num_devices)
        self._auto_devices = num_devices is None

    @property
    def num_devices(self) -> int:
        """The devices the pairs may be sharded over (with `num_devices=None`, particles smaller than
        `SHARD_MIN_SIZE` state elements still stay on one device: `shards(inner_state)`)."""
        return 1 if self.mesh is None else self.mesh.shape[D.AXIS]

    def shards(self, inner_state) -> bool:
        """Whether a truncation over `inner_state` runs sharded, decided at trace time from static shapes.

        Small particles (under `SHARD_MIN_SIZE` elements) stay on one device unless `num_devices`
        was given explicitly.

        Args:
            inner_state: the pairs' states, leaves [2N, ...].

        Returns:
            True when the truncation runs on the mesh (`sharded_truncation`).
        """
        if self.mesh is None:
            return False
        return not (self._auto_devices and particle_size(inner_state) < SHARD_MIN_SIZE)

    def place_theta(self, theta, state):
        """theta replicated on the mesh when the pairs are sharded (`GradientEstimator.place_theta`)."""
        if not self.shards(state.inner_state):
            return theta
        return jax.device_put(theta, NamedSharding(self.mesh, P()))

    def _init_state(self, theta, key, outer_state, data):
        particles = self._init_particles(theta, key, outer_state, data)
        acc = jax.tree_util.tree_map(lambda t: jnp.zeros((self.num_tasks,) + jnp.shape(t), jnp.result_type(t)), theta)
        state = PESState(U.tile(particles, 2), acc)
        if not self.shards(state.inner_state):
            return state
        # [2N] (+ halves, then − halves) sharded so that pair i's two halves live on one device
        pm = jax.tree_util.tree_map(lambda x: x.reshape((2, self.num_tasks) + x.shape[1:]), state.inner_state)
        pm = jax.lax.with_sharding_constraint(pm, NamedSharding(self.mesh, P(None, D.AXIS)))
        return PESState(jax.tree_util.tree_map(lambda x: x.reshape((-1,) + x.shape[2:]), pm),
                        jax.lax.with_sharding_constraint(acc, NamedSharding(self.mesh, P(D.AXIS))))

    def _estimate(self, theta, state, key, outer_state, data):
        k_eps, k_unroll = jax.random.split(key)
        eps = A.sample_perturbations(theta, k_eps, self.num_tasks, self.std)
        if self.shards(state.inner_state):
            n = self.num_tasks
            inner = jax.tree_util.tree_map(lambda x: x.reshape((2, n) + x.shape[1:]), state.inner_state)
            inner, acc, grad, stats = sharded_truncation(
                self.truncated_step, self.mesh, theta, inner, state.accumulator, eps,
                U.step_keys(k_unroll, self.trunc_length, n), self.std, outer_state=outer_state, data=data)
            states = jax.tree_util.tree_map(lambda x: x.reshape((2 * n,) + x.shape[2:]), inner)
            return PESState(states, acc), stats_to_estimate(grad, stats)
        states, out = U.unroll(self.truncated_step, A.tree_stack_pm(theta, eps), state.inner_state, k_unroll,
                               self.trunc_length, reset_groups=2, outer_state=outer_state, data=data)
        grad, acc, stats = pes_update(out, eps, state.accumulator, self.std, self.num_tasks)
        return PESState(states, acc), stats_to_estimate(grad, stats)

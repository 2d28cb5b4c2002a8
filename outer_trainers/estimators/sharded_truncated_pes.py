"""ShardedTruncatedPES: TruncatedPES with the particle axis sharded over local devices.

`TruncatedPESPMAP` is its former name, kept as an alias; it never used `jax.pmap`.

The math is TruncatedPES's (`pes_update`); the N particle pairs are split over a 1-D
`jax.sharding.Mesh` of D devices (axis `devices.AXIS`) with `jax.shard_map`
(`truncated_pes.sharded_truncation`, which TruncatedPES itself uses when several devices are
visible): each device unrolls its N/D pairs (its + and − halves side by side), forms its partial
sum of the estimate, and one `psum` per truncation combines them. What this class adds: the
[2, N] state layout, explicit `devices`, and `share_data`. Perturbations and step keys are drawn exactly as
TruncatedPES draws them, so for the same keys the estimate equals TruncatedPES's up to float
summation order, on any D.

State layout: `PESState(inner_state [2, N, ...] (± first, sharded on N), accumulator [N, ...])`;
`inner_state` reshaped to [2N, ...] is TruncatedPES's [+ half; − half].

`share_data=True` gives local particle j on every device the step keys of particle j on device
0 (so the same data batches — and the same per-step randomness of the TruncatedStep, e.g.
resets — on all devices): cheaper data on real multi-host input pipelines, but the devices'
particles become correlated, so the estimate has higher variance.
"""
from __future__ import annotations

from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from outer_trainers.steps import unroll as U
from outer_trainers.estimators import antithetic as A
from outer_trainers.estimators.gradient_estimator import AntitheticTruncatedEstimator
from outer_trainers.estimators.truncated_pes import PESState, sharded_truncation, stats_to_estimate
from outer_trainers.validation import check_int, check_optional_int
from outer_trainers import devices as D
from outer_trainers.steps.truncated_step import TruncatedStep

AXIS = D.AXIS  # the mesh axis the particle pairs are sharded over (one name, in `devices`)


class ShardedTruncatedPES(AntitheticTruncatedEstimator):
    """TruncatedPES with its N pairs sharded over local devices (see the module docstring).

    Args:
        truncated_step: the unrolled system; each pair carries a + and a − state of it.
        num_tasks: N, the number of ± pairs; a multiple of the number of devices.
        trunc_length: K, the steps of one truncation (one `estimate`).
        std: σ of the fresh perturbations ε_i of every truncation.
        random_initial_iteration_offset: staggers the pairs' first episodes (see `TruncatedEstimator`).
        num_devices: use the first `num_devices` of `devices`; None for all of them.
        devices: the devices to shard over; None for `jax.local_devices()`.
        share_data: give local pair j on every device the step keys of pair j on device 0
            (same data on all devices, correlated pairs, higher variance).
        compiler_options: XLA compile options (see `GradientEstimator`).
    """

    def __init__(self, truncated_step: TruncatedStep, num_tasks: int, trunc_length: int, std: float = 0.01, *,
                 random_initial_iteration_offset: int = 0, num_devices: Optional[int] = None,
                 devices: Optional[Sequence[jax.Device]] = None, share_data: bool = False,
                 compiler_options: Optional[dict] = None):
        devices = list(jax.local_devices() if devices is None else devices)
        if not devices:
            raise ValueError("ShardedTruncatedPES got devices=[]: it needs at least one device to shard its pairs "
                             "over; pass devices=None for jax.local_devices()")
        num_tasks = check_int("num_tasks", num_tasks, minimum=1)
        num_devices = check_optional_int("num_devices", num_devices)
        if num_devices is not None:
            if not 1 <= num_devices <= len(devices):
                raise ValueError(f"num_devices={num_devices} but {len(devices)} local devices are visible "
                                 f"(on CPU, set XLA_FLAGS=--xla_force_host_platform_device_count=N before "
                                 f"importing jax)")
            devices = devices[:num_devices]
        if num_tasks % len(devices):
            raise ValueError(f"ShardedTruncatedPES: num_tasks={num_tasks} is not divisible by the {len(devices)} "
                             f"devices it shards over; use a multiple of {len(devices)} or pass num_devices=")
        self.share_data = bool(share_data)
        self.mesh = Mesh(np.asarray(devices), (AXIS,))
        self.num_devices = len(devices)
        super().__init__(truncated_step, num_tasks, trunc_length, std,
                         random_initial_iteration_offset=random_initial_iteration_offset,
                         compiler_options=compiler_options)
        self.name = f"{type(self).__name__}(n={self.num_tasks},K={self.trunc_length},devices={self.num_devices})"

    def _shard(self, tree, spec):
        return jax.lax.with_sharding_constraint(tree, NamedSharding(self.mesh, spec))

    def place_theta(self, theta, state):
        """theta replicated on the mesh (`GradientEstimator.place_theta`)."""
        return jax.device_put(theta, NamedSharding(self.mesh, P()))

    def _init_state(self, theta, key, outer_state, data):
        n = self.num_tasks
        particles = self._init_particles(theta, key, outer_state, data)
        inner = jax.tree_util.tree_map(lambda x: jnp.stack([x, x]), particles)
        acc = jax.tree_util.tree_map(lambda t: jnp.zeros((n,) + jnp.shape(t), jnp.result_type(t)), theta)
        return PESState(self._shard(inner, P(None, AXIS)), self._shard(acc, P(AXIS)))

    def _estimate(self, theta, state, key, outer_state, data):
        n, K, D = self.num_tasks, self.trunc_length, self.num_devices
        k_eps, k_unroll = jax.random.split(key)
        eps = A.sample_perturbations(theta, k_eps, n, self.std)
        keys = U.step_keys(k_unroll, K, n)  # [K, N], as TruncatedPES's unroll draws them
        if self.share_data:
            keys = jnp.concatenate([keys[:, :n // D]] * D, axis=1)
        inner, acc, grad, stats = sharded_truncation(self.truncated_step, self.mesh, theta, state.inner_state,
                                                     state.accumulator, eps, keys, self.std,
                                                     outer_state=outer_state, data=data)
        new_state = PESState(self._shard(inner, P(None, AXIS)), self._shard(acc, P(AXIS)))
        return new_state, stats_to_estimate(grad, stats)


TruncatedPESPMAP = ShardedTruncatedPES  # the former name

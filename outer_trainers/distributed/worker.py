"""EstimatorWorker: the estimators a Ray worker owns, and their particle states.

    worker = EstimatorWorker(make_run, indices=(0, 2))             # inside a Ray actor
    worker.reset(theta, {0: key_data_0, 2: key_data_2}, outer_iteration)
    version, estimates, seconds = worker.estimate(theta, version, {0: k0, 2: k2}, outer_iteration)

The worker builds the run's estimators itself by calling `make_run()` (the same picklable
description the learner uses: a factory, or the gin config), or `make_run.worker_estimators()`
where the description has one (it builds the estimators alone: `learner.gin_run.GinRun`'s reads
no `theta_init`, since workers get theta from the learner), so no jitted function is ever
pickled; it keeps only those at `indices` (positions in the run's estimator list) and their
states. Everything crossing the process boundary is arrays: theta as a pytree of numpy arrays,
keys as raw key data (`jax.random.key_data`), estimates as `Estimate`s of numpy arrays. Each
estimator compiles on its first `reset` / `estimate`; later calls reuse the programs
(`compiles()` counts XLA compilations in the process, for tests).
"""
from __future__ import annotations

import os
import time
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

_COMPILES = [0]
_LISTENING = [False]


def _count_compiles(event: str, duration: float, **kwargs) -> None:
    if event == "/jax/core/compile/backend_compile_duration":
        _COMPILES[0] += 1


def wrap_keys(key_data: Mapping[int, np.ndarray]) -> dict:
    """Typed PRNG keys from raw key data (`jax.random.key_data`), as sent between processes.

    Args:
        key_data: {estimator index: uint32 key data}.

    Returns:
        {estimator index: typed key}.
    """
    return {int(i): jax.random.wrap_key_data(jnp.asarray(k)) for i, k in key_data.items()}


def key_data(keys: Sequence[jax.Array], indices: Sequence[int]) -> dict:
    """Raw key data of `keys[i]` for each i in `indices`, to send to a worker.

    Args:
        keys: typed PRNG keys, one per estimator of the run.
        indices: the estimators whose keys are sent.

    Returns:
        {index: numpy uint32 key data}.
    """
    return {int(i): np.asarray(jax.random.key_data(keys[i])) for i in indices}


class EstimatorWorker:
    """Owns estimators `indices` of a run and their states; its methods are called through a Ray actor.

    Args:
        make_run: picklable `make_run() -> (GradientLearner, [GradientEstimator, ...])`, the run's
            description (called here, in the worker's process; `make_run.worker_estimators()` instead
            where it has that method).
        indices: the positions, in `make_run()`'s estimator list, of the estimators this worker owns.
    """

    def __init__(self, make_run: Callable[[], tuple], indices: Sequence[int]):
        if not _LISTENING[0]:
            jax.monitoring.register_event_duration_secs_listener(_count_compiles)
            _LISTENING[0] = True
        build = getattr(make_run, "worker_estimators", None)
        estimators = list(build() if callable(build) else make_run()[1])
        bad = [i for i in indices if not 0 <= i < len(estimators)]
        if bad or not indices:
            raise ValueError(f"worker estimator indices {list(indices)} are not in the run's {len(estimators)} "
                             f"estimators")
        self.indices = tuple(int(i) for i in indices)
        self.estimators = {i: estimators[i] for i in self.indices}
        self.states: dict = {}

    def pid(self) -> int:
        """The worker's process id (e.g. for a fault-injection test to kill it)."""
        return os.getpid()

    def node_id(self) -> str:
        """The id of the Ray node the worker runs on."""
        import ray
        return ray.get_runtime_context().get_node_id()

    def num_states(self) -> int:
        """How many of its estimators have particle states (0 until the first `reset` after a (re)start)."""
        return len(self.states)

    def compiles(self) -> int:
        """XLA compilations in this worker's process so far."""
        return _COMPILES[0]

    def reset(self, theta: Any, keys: Mapping[int, np.ndarray], outer_iteration: int) -> int:
        """Fresh states (new particles) for the estimators in `keys`, at `theta`.

        Args:
            theta: the current theta (pytree of arrays).
            keys: {estimator index: key data} for `init_state`.
            outer_iteration: the learner's outer step, passed as `outer_state`.

        Returns:
            The worker's process id.
        """
        theta = jax.tree_util.tree_map(jnp.asarray, theta)
        for i, k in wrap_keys(keys).items():
            self.states[i] = self.estimators[i].init_state(theta, k, outer_state=int(outer_iteration))
        jax.block_until_ready(self.states)
        return os.getpid()

    def estimate(self, theta: Any, version: int, keys: Mapping[int, np.ndarray],
                 outer_iteration: int) -> tuple[int, dict, float]:
        """One estimate from each estimator in `keys` at `theta`, carrying their states on.

        Args:
            theta: theta of version `version` (pytree of arrays).
            version: the learner's update count that produced `theta` (returned, to measure staleness).
            keys: {estimator index: key data} of this estimate.
            outer_iteration: the learner's outer step, passed as `outer_state`.

        Returns:
            (version, {estimator index: Estimate of numpy arrays}, seconds the estimates took), or
            (version, None, 0.0) when an estimator in `keys` has no state: the actor was restarted
            (its process died and Ray re-ran the constructor) since its last `reset`.
        """
        if any(int(i) not in self.states for i in keys):
            return int(version), None, 0.0
        t0 = time.perf_counter()
        theta = jax.tree_util.tree_map(jnp.asarray, theta)
        out = {}
        for i, k in wrap_keys(keys).items():
            self.states[i], out[i] = self.estimators[i].estimate(theta, self.states[i], k,
                                                                  outer_state=int(outer_iteration))
        out = jax.device_get(out)
        return int(version), out, time.perf_counter() - t0

"""Every CPU core by default: one XLA CPU device per core, and the particle axis sharded over them.

XLA's CPU backend runs one program on one device, and the small kernels of a meta-training step
(vmapped inner steps of a few thousand parameters) keep about one core busy. Exposing one XLA
CPU device per core and sharding the estimator's particles over them puts the other cores to work
(TruncatedPES's inner steps per second by core count: docs/benchmarks.md).

- `use_all_cpu_cores()` asks jax for one CPU device per core. It must run before jax initialises
  its backends (before the first array is made), so call it right after `import jax`; the
  scripts do. It leaves alone a device count the user already chose (`XLA_FLAGS` with
  `--xla_force_host_platform_device_count`, `JAX_NUM_CPU_DEVICES`, or `jax_num_cpu_devices`) and
  machines with an accelerator plugin installed.
- `shard_count(num_tasks, devices)`: how many of the local devices an estimator with `num_tasks`
  particles (pairs) shards them over: the most that divide `num_tasks`.
- `particle_mesh(num_tasks, num_devices, devices)`: the 1-D `jax.sharding.Mesh` (axis `AXIS`)
  for that, or None for one device.
"""
from __future__ import annotations

import importlib.util
import os
from typing import Optional, Sequence

import jax
import numpy as np
from jax.sharding import Mesh

AXIS = "tasks"
_ACCELERATOR_PLUGINS = ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm60_plugin", "jax_rocm7_plugin",
                        "libtpu")


def num_cpu_cores() -> int:
    """The CPU cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def use_all_cpu_cores(num_devices: Optional[int] = None) -> int:
    """Make jax's CPU backend expose one device per core (or `num_devices`), unless already chosen.

    Call right after `import jax`, before any array is created: the device count is fixed when
    jax initialises its backends.

    Args:
      num_devices: the number of CPU devices; None for one per core (`num_cpu_cores()`).

    Returns:
      The CPU device count requested, or 0 where nothing was changed: the user already set one
      (`XLA_FLAGS=--xla_force_host_platform_device_count=N`, `JAX_NUM_CPU_DEVICES`, or the
      `jax_num_cpu_devices` option), an accelerator plugin is installed (the estimators then run
      on the accelerator), or jax's backends were already initialised.
    """
    if "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", ""):
        return 0
    if os.environ.get("JAX_NUM_CPU_DEVICES") or jax.config.jax_num_cpu_devices not in (None, -1):
        return 0
    platforms = os.environ.get("JAX_PLATFORMS", "")
    if platforms and "cpu" not in platforms.split(","):
        return 0
    if not platforms and any(importlib.util.find_spec(m) is not None for m in _ACCELERATOR_PLUGINS):
        return 0
    count = num_cpu_cores() if num_devices is None else int(num_devices)
    if count <= 1:
        return 0
    try:
        jax.config.update("jax_num_cpu_devices", count)
    except RuntimeError:  # backends already initialised: the device count can no longer change
        return 0
    return count


def shard_count(num_tasks: int, devices: Sequence[jax.Device]) -> int:
    """The most of `devices` that `num_tasks` particles (pairs) split over evenly.

    Args:
      num_tasks: the number of particles (or ± pairs) to shard.
      devices: the devices available.

    Returns:
      The largest d ≤ len(devices) dividing num_tasks (1 if there is one device).
    """
    return max(d for d in range(1, max(len(devices), 1) + 1) if num_tasks % d == 0)


def particle_mesh(num_tasks: int, num_devices: Optional[int] = None,
                  devices: Optional[Sequence[jax.Device]] = None) -> Optional[Mesh]:
    """The 1-D mesh (axis `AXIS`) an estimator shards its `num_tasks` particles over, or None.

    Args:
      num_tasks: the number of particles (or ± pairs).
      num_devices: how many devices to use; None for `shard_count(num_tasks, devices)`.
      devices: the devices to choose from; None for `jax.local_devices()`.

    Returns:
      A Mesh of the first `num_devices` devices, or None when that is one device.

    Raises:
      ValueError: `num_devices` is more than the devices available, or does not divide `num_tasks`.
    """
    devices = list(jax.local_devices() if devices is None else devices)
    if num_devices is None:
        num_devices = shard_count(num_tasks, devices)
    if not 1 <= num_devices <= len(devices):
        raise ValueError(f"num_devices={num_devices} but {len(devices)} local devices are visible (on CPU, call "
                         f"outer_trainers.use_all_cpu_cores() right after importing jax, or set "
                         f"XLA_FLAGS=--xla_force_host_platform_device_count=N before it)")
    if num_tasks % num_devices:
        raise ValueError(f"num_tasks={num_tasks} is not divisible by the {num_devices} devices it would be sharded "
                         f"over; use a multiple of {num_devices} or pass num_devices=")
    return Mesh(np.asarray(devices[:num_devices]), (AXIS,)) if num_devices > 1 else None

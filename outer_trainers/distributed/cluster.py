"""Connecting to Ray: an existing cluster (fail fast on a bad address) or a local instance.

    started = connect_ray(address)          # None: a local instance on the loopback address
    ...                                     # ray actors, ray.get, ...
    if started: ray.shutdown()

    with ray_connection(address):           # the same, shut down on leaving if it started Ray
        ...

`worker_runtime_env(threads)` is the runtime environment of lopt's actors: it gives them this
process's import path (`import_path`) and caps XLA's and OpenMP's threads per actor, so that N
single-CPU actors on an N-core machine do not each start a pool of N threads (oversubscription
makes every estimate slower, and timings meaningless).
Ray is imported only when these functions run, so `outer_trainers` imports without it.
"""
from __future__ import annotations

import contextlib
import os
import socket
import sys
import warnings
from typing import Iterator, Optional

DEFAULT_CONNECT_TIMEOUT_S = 10.0
RAY_INSTALL_HINT = 'Ray is not installed: pip install -e ".[ray]" (ray[tune] >= 2.40)'


class RayConnectionError(ConnectionError):
    """The Ray cluster at a given address cannot be reached (raised before any work starts)."""


def import_ray():
    """Imports and returns the `ray` module, with a clear error when the "ray" extra is not installed.

    Returns:
        The `ray` module.

    Raises:
        ImportError: Ray is not installed (naming the pip extra to install).
    """
    try:
        import ray
    except ImportError as e:
        raise ImportError(RAY_INSTALL_HINT) from e
    return ray


def _host_port(address: str) -> Optional[tuple[str, int]]:
    """("host", port) of a "host:port" address; None for "auto", "local" and "ray://" client addresses."""
    if address in ("auto", "local") or address.startswith("ray://"):
        return None
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise RayConnectionError(f"bad Ray address {address!r}: expected 'auto', 'host:port' (the head node's GCS "
                                 f"address, e.g. 10.0.0.1:6379) or 'ray://host:port'")
    return host.strip("[]"), int(port)


def connect_ray(address: Optional[str] = None, *, num_cpus: Optional[int] = None,
                timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S) -> bool:
    """Connects this process to Ray, unless it already is.

    With `address=None` a local Ray instance is started, bound to the loopback address
    (127.0.0.1) with the dashboard off. With an address, the head node is first probed with a
    plain TCP connection of at most `timeout_s` seconds, so that a wrong or unreachable address
    fails at once with a message naming it instead of hanging in Ray's retries.

    Args:
        address: None (start a local instance), "auto" (the cluster `ray start` started on this
            machine), "host:port" (a head node's GCS address) or "ray://host:port" (Ray client).
        num_cpus: CPUs of a local instance (None: all of this machine's); ignored with an address.
        timeout_s: how long to try reaching `address` before giving up.

    Returns:
        True when this call started or connected Ray (the caller should `ray.shutdown()` when done);
        False when Ray was already initialised in this process (it is used as it is).

    Raises:
        RayConnectionError: `address` is malformed, or no Ray cluster answers there.
        ImportError: Ray is not installed.
    """
    ray = import_ray()
    if ray.is_initialized():
        return False
    common = dict(include_dashboard=False, log_to_driver=False, configure_logging=False)
    if address is None:
        with warnings.catch_warnings():
            # Ray starts its processes with fork+exec, which JAX's fork warning cannot tell from a bare fork
            warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)
            ray.init(num_cpus=num_cpus, _node_ip_address="127.0.0.1", **common)
        return True
    target = _host_port(address)
    if target is not None:
        try:
            with socket.create_connection(target, timeout=timeout_s):
                pass
        except OSError as e:
            raise RayConnectionError(f"cannot reach a Ray cluster at --ray_address {address!r} within {timeout_s:g} s "
                                     f"({e}). Start one with `ray start --head` on the head node and pass its "
                                     f"address (host:port, default port 6379), or 'auto' on a machine of the "
                                     f"cluster; omit the address to run a local Ray instance.") from None
    try:
        ray.init(address=address, **common)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise RayConnectionError(f"cannot connect to a Ray cluster at --ray_address {address!r}: {e}. Start one "
                                 f"with `ray start --head` (then 'auto' on that machine, or host:port elsewhere), "
                                 f"or omit the address to run a local Ray instance.") from None
    return True


@contextlib.contextmanager
def ray_connection(address: Optional[str] = None, **connect_options) -> Iterator[bool]:
    """`connect_ray(address)` for the duration of a `with` block.

    Ray is shut down when the block is left (normally or by an exception) if this call started
    or connected it; a Ray already initialised in this process is left running.

    Args:
        address: as for `connect_ray` (None: a local instance on the loopback address).
        **connect_options: the other arguments of `connect_ray` (num_cpus, timeout_s).

    Yields:
        Whether this call started or connected Ray (`connect_ray`'s answer).

    Raises:
        RayConnectionError: `address` is malformed, or no Ray cluster answers there (before the block runs).
        ImportError: Ray is not installed.
    """
    started = connect_ray(address, **connect_options)
    try:
        yield started
    finally:
        if started:
            import_ray().shutdown()


def import_path() -> str:
    """This process's own import directories (its `sys.path` without the interpreter's), as a PYTHONPATH.

    Actors get it so that they import what the driver imports by name (e.g. a run factory defined in
    a script's module, or in a test module); on other machines these paths must hold the same code.

    Returns:
        The directories joined with `os.pathsep`, followed by this process's PYTHONPATH ("" if none).
    """
    prefixes = tuple(os.path.realpath(p) for p in {sys.prefix, sys.base_prefix, sys.exec_prefix})
    own = [os.path.abspath(p or os.getcwd()) for p in sys.path]
    own = [p for p in own if os.path.isdir(p) and not os.path.realpath(p).startswith(prefixes)]
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return os.pathsep.join(dict.fromkeys(own + extra))


def worker_runtime_env(threads: Optional[int] = 1) -> dict:
    """The Ray runtime environment of lopt's actors: this process's import path, and XLA and OpenMP
    limited to `threads` threads.

    Args:
        threads: threads per actor process (None: no limit, the libraries' defaults). With one
            CPU per actor, 1 avoids oversubscribing the cores.

    Returns:
        {"env_vars": {...}} for `ActorClass.options(runtime_env=...)`: PYTHONPATH (`import_path()`)
        and, unless `threads` is None, the thread limits and one XLA CPU device (JAX_NUM_CPU_DEVICES=1;
        XLA_FLAGS keeps this process's flags except a simulated device count).
    """
    env = {}
    path = import_path()
    if path:
        env["PYTHONPATH"] = path
    if threads is None:
        return {"env_vars": env} if env else {}
    # one core per actor: one XLA CPU device (a simulated device count in this process's flags is dropped)
    flags = " ".join(f for f in os.environ.get("XLA_FLAGS", "").split()
                     if not f.startswith("--xla_force_host_platform_device_count"))
    if threads == 1 and "xla_cpu_multi_thread_eigen" not in flags:
        flags = (flags + " --xla_cpu_multi_thread_eigen=false").strip()
    env.update({"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
                "OPENBLAS_NUM_THREADS": str(threads), "TF_NUM_INTRAOP_THREADS": str(threads),
                "JAX_NUM_CPU_DEVICES": "1"})
    if flags:
        env["XLA_FLAGS"] = flags
    return {"env_vars": env}

"""Connecting to Ray: a bad address fails fast with a message naming it; the actors' thread limits."""
import socket

import pytest

from outer_trainers.distributed import RayConnectionError, connect_ray, worker_runtime_env


def _closed_port() -> int:
    with socket.socket() as s:  # a port nothing listens on (bound, then released)
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_bad_address_fails_fast_naming_it(monkeypatch):
    import ray
    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # as in a fresh process
    address = f"127.0.0.1:{_closed_port()}"
    with pytest.raises(RayConnectionError, match=address.replace(".", r"\.")):
        connect_ray(address, timeout_s=5.0)  # refused by the TCP probe, before Ray's long retries
    with pytest.raises(RayConnectionError, match="no-port"):
        connect_ray("no-port")


def test_worker_runtime_env_caps_threads(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2 --xla_dump_to=/tmp/x")
    env = worker_runtime_env(1)["env_vars"]
    assert env["OMP_NUM_THREADS"] == "1" and env["JAX_NUM_CPU_DEVICES"] == "1"
    assert env["XLA_FLAGS"].split() == ["--xla_dump_to=/tmp/x", "--xla_cpu_multi_thread_eigen=false"]
    assert set(worker_runtime_env(None)["env_vars"]) == {"PYTHONPATH"}
    assert env["PYTHONPATH"] == worker_runtime_env(None)["env_vars"]["PYTHONPATH"]

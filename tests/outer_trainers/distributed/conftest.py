"""One loopback-only local Ray instance shared by the distributed tests (dashboard off, 4 logical CPUs).

RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 is set before Ray starts (without it Ray may bind to the
machine's external interface). Tests that need a multi-node `ray.cluster_utils.Cluster` shut
the shared instance down first; the next test using `ray_local` starts it again.
"""
import os

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

import pytest  # noqa: E402
import ray  # noqa: E402  (in the "test" extra: a missing Ray fails the tests, it never skips them)

NUM_CPUS = 4  # logical: 2 workers + an evaluation actor (+ the driver) on this 2-core machine


@pytest.fixture
def ray_local():
    """The shared local Ray instance (started on first use)."""
    if not ray.is_initialized():
        ray.init(num_cpus=NUM_CPUS, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False,
                 configure_logging=False)
    yield ray


def pytest_sessionfinish(session, exitstatus):
    if ray.is_initialized():
        ray.shutdown()

"""A real local Ray cluster for the Ray suites: a head node and a second node, each
its own raylet and worker processes on loopback (``ray.cluster_utils.Cluster``, the
harness Ray's own multi-node tests use), never a mock. Started once per session.
The suites skip, saying why, when Ray is not installed; CI installs it
(``make sync-all``) and must run them."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

# Before Ray is imported: every node, worker and driver then takes the loopback
# address as its own (Ray reads this at import; on Linux it defaults to the
# machine's address), so the cluster listens on and talks over 127.0.0.1 only.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# Under `uv run pytest`, Ray would start its workers with `uv run` in an
# environment of the project's default groups, which lacks Ray itself: they use
# this interpreter (the environment `make sync-all` made) instead.
os.environ["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] = "0"


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    try:
        import ray
        from ray.cluster_utils import Cluster
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("CI must run the Ray suites; install the ray group (make sync-all)")
        pytest.skip("Ray is not installed; `uv sync --group ray` (make sync-all) installs it")
    # Two nodes of two (logical) CPUs each: three Ray Train workers fit, and write
    # tasks spread over both nodes.
    node = {
        "num_cpus": 2,
        "object_store_memory": 256 << 20,
        "include_dashboard": False,
    }
    cluster = Cluster(initialize_head=True, head_node_args=node)
    cluster.add_node(**{k: v for k, v in node.items() if k != "include_dashboard"})
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        nodes = [n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]]
        assert nodes == ["127.0.0.1", "127.0.0.1"], nodes
        # Workers start and run a task on both nodes, or every test of the
        # session fails now, saying so, instead of each waiting out its timeout.
        ping = ray.remote(num_cpus=1)(lambda: ray.get_runtime_context().get_node_id())
        try:
            ran_on = ray.get([ping.remote() for _ in range(8)], timeout=120)
        except Exception as error:
            pytest.fail(f"the local Ray cluster cannot run a task: {error!r}")
        assert len(ran_on) == 8
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()

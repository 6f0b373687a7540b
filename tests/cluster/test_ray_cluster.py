"""A real Ray cluster on two emulated hosts (``ray start --head`` in h1's namespaces,
``ray start --address`` in h2's, 2 CPUs each), Horovod's RayExecutor with 4 workers:
packed (``num_workers=4``: 2 a host, as the hosts hold 2 each) and spread
(``num_hosts=2, num_workers_per_host=2``): every rank's host, local and cross rank
against the placement, results against numpy and one process on the whole batch.
Nothing of Ray is left on the hosts afterwards."""
from __future__ import annotations

import pytest

from ray_cluster import RayNode, run_driver

from .jobs import assert_nothing_left

pytest.importorskip("ray", reason="the Ray tests need ray: pip install horovodish[ray]")


@pytest.fixture(scope="module")
def ray_on_two_hosts(cluster):
    env = cluster.env()
    head = RayNode.head(num_cpus=2, on=cluster.on_host("h1", []), ip=cluster.address("h1"),
                        env=env)
    nodes = [head]
    try:
        worker = RayNode.worker(head.address, 2, cluster.on_host("h2", []),
                                cluster.address("h2"), env=env)
        nodes.append(worker)
        yield head
    finally:
        for node in reversed(nodes):
            node.stop()
        assert_nothing_left(cluster)


@pytest.mark.parametrize("placement", [["--workers", "4"], ["--hosts", "2", "--per-host", "2"]],
                         ids=["pack", "spread"])
def test_executor_places_ranks_host_by_host(cluster, ray_on_two_hosts, placement):
    outcome = run_driver(ray_on_two_hosts.address, "executor", *placement,
                         on=cluster.on_host("h1", []), env=cluster.env(), timeout=300)
    assert outcome["problems"] == [], outcome["output"][-5000:]
    got = [(p["rank"], p["host"], p["local_rank"], p["local_size"], p["cross_rank"],
            p["cross_size"]) for p in outcome["places"]]
    hosts = [p["host"] for p in outcome["places"]]
    first, second = hosts[0], ({"h1", "h2"} - {hosts[0]}).pop()
    assert got == [(0, first, 0, 2, 0, 2), (1, first, 1, 2, 0, 2),
                   (2, second, 0, 2, 1, 2), (3, second, 1, 2, 1, 2)], outcome

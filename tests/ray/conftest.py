"""One local Ray cluster (a head with this machine's 2 CPUs, and 2 logical GPUs for the
jobs that ask for GPUs as Horovod's Ray examples do) for every Ray test of the session;
nothing of it is left running afterwards."""
from __future__ import annotations

import pytest

from ray_cluster import RayNode, processes_of

pytest.importorskip("ray", reason="the Ray tests need ray: pip install horovodish[ray]")


@pytest.fixture(scope="session")
def ray_head():
    head = RayNode.head(num_cpus=2, num_gpus=2)
    try:
        yield head
    finally:
        head.stop()
        assert not processes_of(head.temp_dir), processes_of(head.temp_dir)

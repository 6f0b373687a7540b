"""One emulated cluster (3 hosts, 1 Gbit/s links) for every multi-host test of a session.

Building it takes a fraction of a second, but each test would pay for the teardown of its
processes too; one cluster, and a check after each job that nothing is left on any host.
Where the machine cannot build one (not root, no iproute2), the tests skip with the reason.
"""
from __future__ import annotations

import pytest

from .cluster import Cluster, missing_requirements


@pytest.fixture(scope="session")
def cluster():
    why = missing_requirements()
    if why:
        pytest.skip(why)
    with Cluster(hosts=3, rate="1gbit") as built:
        yield built

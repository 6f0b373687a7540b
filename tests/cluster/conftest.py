"""One emulated cluster (3 hosts, 1 Gbit/s links) for every multi-host test of a session.

Building it takes a fraction of a second, but each test would pay for the teardown of its
processes too; one cluster, and a check after each job that nothing is left on any host.
Where the machine cannot build one (not root, no iproute2), the tests skip with the
reason; under CI (CI=true), where they must run, they fail with it instead.
"""
from __future__ import annotations

import os

import pytest

from .cluster import Cluster, missing_requirements


def under_ci() -> bool:
    """CI sets CI=true (GitHub Actions, GitLab and others do too)."""
    return os.environ.get("CI", "").lower() in ("true", "1")


@pytest.fixture(scope="session")
def cluster_machine() -> None:
    """This machine can build an emulated cluster; else skip, or under CI fail."""
    why = missing_requirements()
    if why and under_ci():
        pytest.fail(f"CI=true, yet the cluster tests cannot run: {why}. CI must run them "
                    "as root with iproute2, tc, nsenter and unshare installed.",
                    pytrace=False)
    if why:
        pytest.skip(why)


@pytest.fixture(scope="session")
def cluster(cluster_machine):
    with Cluster(hosts=3, rate="1gbit") as built:
        yield built

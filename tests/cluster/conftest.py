"""The emulated clusters the multi-host tests share, one of each per test session.

* ``cluster``: 3 hosts, 1 Gbit/s links, for jobs started with horovodishrun or mpirun.
* ``slurm`` and ``sshd``: 2 more hosts running daemons: a real Slurm (tests/cluster/
  slurm.py: slurmctld, a slurmd per host, munge) and OpenSSH's sshd on port 2222 as in
  an MPI Operator job (tests/cluster/sshd.py). Their own hosts, because the daemons live
  there for the whole session while the other tests check that nothing is left on
  theirs after each job.

Building one takes a fraction of a second (Slurm's daemons about one more), but each test
would pay for the teardown of its processes too; one of each, and a check after each job
that nothing is left on any host. Where the machine cannot build one (not root, no
iproute2, no Slurm or sshd), the tests skip with the reason; under CI (CI=true), where
they must run, they fail with it instead.
"""
from __future__ import annotations

import os

import pytest

from .cluster import Cluster, missing_requirements
from .jobs import assert_nothing_left
from .slurm import RESIDENTS, Slurm, missing_slurm
from .sshd import Sshd, missing_sshd


def under_ci() -> bool:
    """CI sets CI=true (GitHub Actions, GitLab and others do too)."""
    return os.environ.get("CI", "").lower() in ("true", "1")


def require(why: str | None) -> None:
    """Nothing when why is None; else skip with it, or under CI fail with it."""
    if why and under_ci():
        pytest.fail(f"CI=true, yet the cluster tests cannot run: {why}. CI must run them "
                    "as root with iproute2, tc, nsenter and unshare installed (and "
                    "slurm-wlm, munge and openssh-server, which .ci/run installs).",
                    pytrace=False)
    if why:
        pytest.skip(why)


@pytest.fixture(scope="session")
def cluster_machine() -> None:
    """This machine can build an emulated cluster; else skip, or under CI fail."""
    require(missing_requirements())


@pytest.fixture(scope="session")
def cluster(cluster_machine):
    with Cluster(hosts=3, rate="1gbit") as built:
        yield built


@pytest.fixture(scope="session")
def daemon_cluster(cluster_machine):
    with Cluster(hosts=2, rate="1gbit", prefix=f"hvc{os.getpid()}d") as built:
        yield built


@pytest.fixture(scope="session")
def _slurm(daemon_cluster):
    require(missing_slurm())
    return Slurm(daemon_cluster).up()


@pytest.fixture(scope="session")
def _sshd(daemon_cluster):
    require(missing_sshd())
    return Sshd(daemon_cluster).up()


@pytest.fixture
def slurm(_slurm):
    """The Slurm cluster; after the test, no job in the queue and no job process left
    on any of its hosts (else the test fails naming them, and they are ended)."""
    yield _slurm
    _slurm.assert_nothing_left()


@pytest.fixture
def sshd(_sshd):
    """sshd on both hosts; after the test, no job process left on them."""
    yield _sshd
    for host in _sshd.cluster.hosts:
        if host not in _sshd.running:
            _sshd.start(host)
    assert_nothing_left(_sshd.cluster, residents=RESIDENTS)

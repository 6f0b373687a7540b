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
iproute2, no Slurm), the tests skip with the reason.
"""
from __future__ import annotations

import os

import pytest

from .cluster import Cluster, missing_requirements
from .jobs import assert_nothing_left
from .slurm import RESIDENTS, Slurm, missing_slurm
from .sshd import Sshd, missing_sshd


@pytest.fixture(scope="session")
def cluster():
    why = missing_requirements()
    if why:
        pytest.skip(why)
    with Cluster(hosts=3, rate="1gbit") as built:
        yield built


@pytest.fixture(scope="session")
def daemon_cluster():
    why = missing_requirements()
    if why:
        pytest.skip(why)
    with Cluster(hosts=2, rate="1gbit", prefix=f"hvc{os.getpid()}d") as built:
        yield built


@pytest.fixture(scope="session")
def _slurm(daemon_cluster):
    why = missing_slurm()
    if why:
        pytest.skip(why)
    return Slurm(daemon_cluster).up()


@pytest.fixture(scope="session")
def _sshd(daemon_cluster):
    why = missing_sshd()
    if why:
        pytest.skip(why)
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

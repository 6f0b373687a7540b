"""The Kubernetes MPI Operator's contract (v2, ``mpiImplementation: MPICH``), on two
emulated hosts running OpenSSH's sshd on port 2222 with the client configured as an
operator image is (tests/cluster/sshd.py): the launcher finds its hosts in
``HYDRA_HOST_FILE`` or an Open MPI hostfile variable, a ``discover_hosts.sh`` that
prints names without slot counts works with ``--slots``, and a host whose name and sshd
come up after the launcher starts is waited for within ``--start-timeout``. Results are
checked against numpy on every rank, placement against the hostnames."""
from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest
from multirank import assert_ranks_ok

WORKER = Path(__file__).parent / "workers" / "scheduled_worker.py"
CHECKS = ["check_topology", "check_allreduce", "check_other_collectives"]
LAUNCHER = [sys.executable, "-m", "horovodish.launcher"]


def _job(sshd, launcher_args, layout: str = "h1:2,h2:2", timeout: float = 120, **env):
    """The worker launched from h1; h2 must have been reached through its sshd (the
    launcher's check and Hydra's start of its proxy: two logins at least)."""
    before = sshd.logins("h2")
    result = sshd.cluster.run("h1", [*LAUNCHER, *map(str, launcher_args), sys.executable,
                                     str(WORKER), layout],
                              env=sshd.env(PYTHONUNBUFFERED="1", **env), timeout=timeout)
    assert sshd.logins("h2") - before >= 2, (sshd.logins("h2"), before, result.stdout)
    return result





@pytest.mark.parametrize("variable, text", [
    ("HYDRA_HOST_FILE", "h1:2\nh2:2\n"),                              # MPICH's, the operator's
    ("OMPI_MCA_orte_default_hostfile", "h1 slots=2\nh2 slots=2\n"),   # Open MPI's
])
def test_the_hostfile_the_operator_names(sshd, tmp_path, variable, text):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(text)
    result = _job(sshd, [], **{variable: str(hostfile)})
    assert_ranks_ok(result, 4, CHECKS)


def test_discover_hosts_without_slot_counts(sshd, tmp_path):
    """The operator's /etc/mpi/discover_hosts.sh prints one pod name a line."""
    script = tmp_path / "discover_hosts.sh"
    script.write_text("#!/bin/sh\necho h1\necho h2\n")
    script.chmod(0o755)
    result = _job(sshd, ["-np", "4", "--min-np", "2", "--slots", "2",
                         "--host-discovery-script", script])
    assert_ranks_ok(result, 4, CHECKS)


def test_a_pod_whose_name_and_sshd_come_up_late(sshd, tmp_path):
    """h2's name resolves 2 s after the launcher starts and its sshd answers 2 s later;
    the launcher's start check waits for both (within --start-timeout), then the job
    runs."""
    hosts_file = sshd.cluster.state / "etc-hosts"
    full = hosts_file.read_text()
    sshd.stop("h2")
    hosts_file.write_text("".join(line for line in full.splitlines(keepends=True)
                                  if not line.rstrip().endswith(" h2")))

    def come_up() -> None:
        time.sleep(2)
        hosts_file.write_text(full)
        time.sleep(2)
        sshd.start("h2")

    riser = threading.Thread(target=come_up, daemon=True)
    try:
        hostfile = tmp_path / "hostfile"
        hostfile.write_text("h1:2\nh2:2\n")
        riser.start()
        started = time.monotonic()
        result = _job(sshd, ["--start-timeout", "30"], HYDRA_HOST_FILE=str(hostfile))
        waited = time.monotonic() - started
    finally:
        riser.join()
        hosts_file.write_text(full)
    assert_ranks_ok(result, 4, CHECKS)
    assert waited >= 4, waited

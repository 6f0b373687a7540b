"""horovodishrun across emulated hosts: -H and --hostfile reach the hosts through ssh,
ssh options reach ssh, and a host that cannot be reached is named within the start
timeout, before anything starts."""
from __future__ import annotations

import time

from multirank import assert_ok

from .jobs import run_job

HOSTNAME = "import socket, sys; from mpi4py import MPI; " \
           "sys.stdout.write(f'rank {MPI.COMM_WORLD.rank} on {socket.gethostname()}\\n')"


def _script(tmp_path, body: str):
    path = tmp_path / "job.py"
    path.write_text(body)
    return path


def test_hosts_ssh_options_and_interface(cluster, tmp_path):
    log_before = len(cluster.ssh_log().splitlines())
    result = run_job(cluster, _script(tmp_path, HOSTNAME), "h1:1,h2:2",
                     launcher_args=["-p", "2222", "-i", "/keys/id_test", "--network-interface",
                                    "eth0", "--start-timeout", "20"])
    assert_ok(result)
    where = sorted(line for line in result.stdout.splitlines() if line.startswith("rank "))
    assert where == ["rank 0 on h1", "rank 1 on h2", "rank 2 on h2"], result.stdout
    calls = cluster.ssh_log().splitlines()[log_before:]
    # The launcher's check, then Hydra's launch of its proxy: both with the options.
    assert any(c.startswith("-o BatchMode=yes") and c.endswith(" h2 true") for c in calls), calls
    hydra = [c for c in calls if "hydra_pmi_proxy" in c]
    assert len(hydra) == 1 and "-o ConnectTimeout=20 -p 2222 -i /keys/id_test h2 " in hydra[0] \
        and "--iface eth0" in hydra[0], calls


def test_hostfile(cluster, tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("h3 slots=1\nh1:1  # the launching host\n")
    result = run_job(cluster, _script(tmp_path, HOSTNAME), "h3:1,h1:1", hostfile=hostfile)
    assert_ok(result)
    where = sorted(line for line in result.stdout.splitlines() if line.startswith("rank "))
    assert where == ["rank 0 on h3", "rank 1 on h1"], result.stdout


def test_unknown_and_unreachable_hosts_are_named(cluster, tmp_path):
    script = _script(tmp_path, HOSTNAME)
    result = run_job(cluster, script, "h1:1,h7:1", launcher_args=["--start-timeout", "2"])
    assert result.returncode == 255, result.stdout
    assert "horovodishrun: cannot start the job: h7: ssh failed: ssh: Could not resolve " \
        "hostname h7" in result.stdout, result.stdout
    cluster.set_link("h3", False)
    try:
        start = time.monotonic()
        result = run_job(cluster, script, "h1:1,h2:1,h3:1",
                         launcher_args=["--start-timeout", "3"])
        elapsed = time.monotonic() - start
    finally:
        cluster.set_link("h3", True)
    assert result.returncode == 255, result.stdout
    # ssh's own ConnectTimeout (the start timeout) fires first, as over a real dead link.
    assert "horovodishrun: cannot start the job: h3: ssh failed: ssh: connect to host h3 " \
        "port 22: Connection timed out" in result.stdout, result.stdout
    assert "h2" not in result.stdout.replace("h1:1,h2:1,h3:1", ""), result.stdout
    assert elapsed < 3 + 8, elapsed

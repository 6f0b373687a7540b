"""The emulated cluster itself: plain mpirun reaches the hosts through the ssh stand-in,
MPI's bytes cross the shaped link, and a cluster whose creator is killed vanishes."""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from multirank import assert_ok

from .cluster import ROOT, _netns_names
from .jobs import assert_nothing_left

SEND = """
import socket, sys, numpy as np
from mpi4py import MPI
comm = MPI.COMM_WORLD
data = np.full(8 << 20, comm.rank + 1, np.uint8)
if comm.rank == 0:
    comm.Send(data, dest=1)
else:
    comm.Recv(data, source=0)
    assert np.all(data == 1)
sys.stdout.write(f"rank {comm.rank} on {socket.gethostname()} ok\\n")
"""


def test_plain_mpirun_and_bytes_on_the_link(cluster, tmp_path):
    script = tmp_path / "send.py"
    script.write_text(SEND)
    mpirun = str(Path(sys.executable).parent / "mpirun")
    before = cluster.link_bytes()
    result = cluster.run("h1", [mpirun, "-np", "2", "-hosts", "h1:1,h3:1", sys.executable,
                                str(script)], timeout=60)
    after = cluster.link_bytes()
    assert_nothing_left(cluster)
    assert_ok(result)
    assert "rank 0 on h1 ok" in result.stdout and "rank 1 on h3 ok" in result.stdout
    sent = after["h1"] - before["h1"]
    assert 8 << 20 <= sent < (8 << 20) * 1.1, f"h1 sent {sent} bytes over its link"
    assert after["h2"] - before["h2"] < 10_000  # (ARP and the like at most)


def test_a_killed_creator_leaves_nothing_behind(cluster_machine):
    creator = subprocess.Popen(
        [sys.executable, "-c", "import time; from cluster.cluster import Cluster; "
         "c = Cluster(2).up(); print(c.prefix, flush=True); time.sleep(120)"],
        stdout=subprocess.PIPE, text=True)
    prefix = creator.stdout.readline().strip()
    assert prefix.startswith("hvc") and any(n.startswith(prefix) for n in _netns_names())
    creator.send_signal(signal.SIGKILL)
    creator.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (
            any(n.startswith(prefix + "-") for n in _netns_names()) or (ROOT / prefix).exists()):
        time.sleep(0.1)
    assert not any(n.startswith(prefix + "-") for n in _netns_names()), _netns_names()
    assert not (ROOT / prefix).exists()

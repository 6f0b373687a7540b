"""Running a job on the emulated cluster the way a user would: ``horovodishrun -H ...``
on h1, through the one multi-rank helper (tests/multirank.py)."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

from multirank import run_ranks

from .cluster import Cluster

WORKERS = Path(__file__).parent / "workers"


def ranks_of(hosts: str) -> int:
    """'h1:2,h2:2' -> 4."""
    return sum(int(item.split(":")[1]) for item in hosts.split(","))


def run_job(cluster: Cluster, script: str | Path, hosts: str = "h1:2,h2:2",
            args: Sequence[str] = (), env: Mapping[str, str] | None = None,
            timeout: float = 120, launcher_args: Sequence[str] = (),
            hostfile: Path | None = None) -> subprocess.CompletedProcess:
    """Run script on the hosts (launched from h1; given as -H, or as --hostfile when
    hostfile is given: then hosts only counts the ranks); then every host must be left
    with no process of the job within 10 s (else the test fails naming them)."""
    where = ["--hostfile", str(hostfile)] if hostfile else []
    try:
        return run_ranks(WORKERS / script if isinstance(script, str) else script,
                         ranks_of(hosts), args=args, env=cluster.env(**(env or {})),
                         timeout=timeout, hosts=None if hostfile else hosts,
                         launch_on=cluster.on_host("h1", []),
                         launcher_args=[*where, *launcher_args])
    finally:
        assert_nothing_left(cluster)


def assert_nothing_left(cluster: Cluster, within: float = 10.0,
                        residents: Collection[str] = ()) -> None:
    """No process on any host within ``within`` seconds but the daemons named in
    residents (by command name: slurmd, sshd ...); else they are killed and the test
    fails naming them, with what each waits in."""
    deadline = time.monotonic() + within
    while True:
        left = {host: [p for p in cluster.pids(host) if _command(p) not in residents]
                for host in cluster.hosts}
        left = {host: pids for host, pids in left.items() if pids}
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    if left:
        pids = [p for host_pids in left.values() for p in host_pids]
        listing = subprocess.run(["ps", "-o", "pid,ppid,etime,wchan:24,args", "-p",
                                  ",".join(map(str, pids))],
                                 capture_output=True, text=True).stdout
        where = "\n".join(f"{pid}: {_rank_and_threads(pid)}" for pid in pids)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        raise AssertionError(f"processes left behind after the job: {left}\n{listing}"
                             f"\n{where}")


def _command(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None


def _rank_and_threads(pid: int) -> str:
    """For a process left behind: its MPI rank and what each of its threads waits in
    (the kernel's wait channel), to tell a rank stuck writing to a full pipe from one
    polling a dead link."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        rank = next((e.split(b"=", 1)[1].decode() for e in environ
                     if e.startswith(b"PMI_RANK=")), "?")
        threads = []
        for task in sorted(Path(f"/proc/{pid}/task").iterdir()):
            name = (task / "comm").read_text().strip()
            threads.append(f"{name}:{(task / 'wchan').read_text().strip() or '-'}")
        return f"rank {rank}; threads " + ", ".join(threads)
    except OSError as exc:  # gone meanwhile
        return f"({exc.strerror})"

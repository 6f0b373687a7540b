"""Multi-host launching: ssh options and network interface for each mpirun, and a check
that every remote host answers over ssh before the job starts.

Why a check of our own: when a host is down, mis-named or refuses the key, Hydra prints
"Launch proxy failed" and a stack of its own source lines (ssh's own message, the only
line naming the host, is somewhere above), and over a dead link ssh waits for the TCP
timeout, minutes. Like ``horovodrun``, the launcher first runs ``ssh HOST true`` on every
remote host in parallel, bounded by --start-timeout, and names each host that failed.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from .hosts import Host

DEFAULT_START_TIMEOUT = 30.0  # horovodrun's default
# The launchers that start remote processes over ssh; a job under any other (slurm, say)
# skips the check.
_SSH_LAUNCHERS = ("ssh", "rsh")
# Variables of the allocations whose launcher Hydra picks by itself (slurm, pbs, lsf,
# loadleveler, sge).
_SCHEDULERS = ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "LOADL_STEP_ID", "PE_HOSTFILE")


@dataclass(frozen=True)
class Remote:
    """How to reach the hosts: ssh port and identity, start timeout, network interfaces."""

    ssh_port: int | None = None
    identity_file: str | None = None
    start_timeout: float = DEFAULT_START_TIMEOUT
    interfaces: tuple[str, ...] = ()

    def ssh_options(self) -> list[str]:
        """Options for every ssh the job makes: port, identity, and a connect timeout so a
        dead host fails within the start timeout instead of after TCP's."""
        options = ["-o", f"ConnectTimeout={max(1, int(self.start_timeout))}"]
        if self.ssh_port is not None:
            options += ["-p", str(self.ssh_port)]
        if self.identity_file is not None:
            options += ["-i", self.identity_file]
        return options


def mpirun_args(remote: Remote, flavour: str, over_ssh: bool) -> tuple[list[str], dict[str, str]]:
    """(mpirun arguments, variables for mpirun's own environment) for ``remote``.

    Hydra: ``-iface IF`` (one interface: its address carries Hydra's control connections
    and names the launching host to the proxies) and ssh options through
    HYDRA_LAUNCHER_EXTRA_ARGS. Open MPI: ``btl_tcp_if_include``/``oob_tcp_if_include``
    and ``plm_rsh_args``. The ssh options go only to a job that reaches remote hosts over
    ssh (``over_ssh``): under a scheduler Hydra hands HYDRA_LAUNCHER_EXTRA_ARGS to srun,
    which would read ``-o ConnectTimeout=30`` as a file for the ranks' output (and newer
    Slurm releases put their own srun options there). The ranks' own TCP (libfabric's tcp provider, NCCL) get the
    interface through FI_TCP_IFACE and NCCL_SOCKET_IFNAME, forwarded by the caller."""
    argv: list[str] = []
    env: dict[str, str] = {}
    ssh = " ".join(remote.ssh_options())
    if flavour == "openmpi":
        if remote.interfaces:
            names = ",".join(remote.interfaces)
            argv += ["--mca", "btl_tcp_if_include", names, "--mca", "oob_tcp_if_include", names]
        if over_ssh:
            argv += ["--mca", "plm_rsh_args", ssh]
    else:
        if remote.interfaces:
            argv += ["-iface", remote.interfaces[0]]
        if over_ssh:  # (run.py keeps what the caller had set there too)
            env["HYDRA_LAUNCHER_EXTRA_ARGS"] = ssh
    return argv, env


def rank_env(remote: Remote) -> dict[str, str]:
    """Variables for the ranks: the interface for libfabric's tcp provider and NCCL."""
    if not remote.interfaces:
        return {}
    names = ",".join(remote.interfaces)
    return {"FI_TCP_IFACE": remote.interfaces[0], "NCCL_SOCKET_IFNAME": names}


def is_local(name: str) -> bool:
    """Whether host name is this machine (mpirun starts its ranks without ssh)."""
    here = socket.gethostname()
    return name in ("localhost", "127.0.0.1", "::1", here, here.split(".")[0],
                    socket.getfqdn())


def remote_hosts(hosts: Sequence[Host] | None) -> list[str]:
    """The distinct hosts of the job other than this one, in order."""
    return [name for name in dict.fromkeys(h.name for h in hosts or ()) if not is_local(name)]


def uses_ssh(mpi_args: Sequence[str], environ: Mapping[str, str]) -> bool:
    """False when --mpi-args, the environment or a scheduler's allocation (which Hydra
    and Open MPI detect, and then start ranks through) picks a launcher other than ssh:
    the check would then test the wrong thing."""
    args = list(mpi_args)
    for flag in ("-launcher", "-bootstrap", "--launcher"):
        if flag in args:
            value = args[args.index(flag) + 1:][:1]
            return bool(value) and value[0] in _SSH_LAUNCHERS
    launcher = environ.get("HYDRA_LAUNCHER") or environ.get("HYDRA_BOOTSTRAP")
    if launcher is not None:
        return launcher in _SSH_LAUNCHERS
    return not any(name in environ for name in _SCHEDULERS)


RETRY_INTERVAL = 1.0  # seconds between attempts at a host that could not be reached


def check_hosts(hosts: Sequence[str], remote: Remote, ssh: str = "ssh") -> list[str]:
    """Run ``ssh HOST true`` on every host at once; one message per host that failed
    (empty: all answered), each naming the host and saying why, all within
    remote.start_timeout seconds (plus a second).

    A host that ssh cannot reach (its exit code 255: a name that does not resolve yet,
    a refused connection, a key not accepted yet) is tried again every second until the
    start timeout: the pods of a Kubernetes job come up in any order, and their names
    and sshd some time after the launcher's."""
    if not hosts:
        return []
    argv = [ssh, "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
            *remote.ssh_options()]
    deadline = time.monotonic() + remote.start_timeout

    def attempt(host: str) -> tuple[int | None, str]:
        """(ssh's exit code, its last line of stderr); None: no answer in time; -1: ssh
        itself cannot run."""
        try:
            proc = subprocess.Popen([*argv, host, "true"], stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                    text=True, errors="replace", start_new_session=True)
        except OSError as exc:
            return -1, f"cannot run {ssh}: {exc}"
        try:
            _, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()) + 1)
        except subprocess.TimeoutExpired:
            try:  # its group: a wrapper's children would keep the pipe open
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.communicate()
            return None, ""
        last = [line for line in err.splitlines() if line.strip()][-1:] or \
            [f"exit code {proc.returncode}"]
        return proc.returncode, last[0].strip()

    def probe(host: str) -> str | None:
        while True:
            code, why = attempt(host)
            if code == 0:
                return None
            if code is None:
                return (f"{host}: no answer over ssh within the start timeout "
                        f"({remote.start_timeout:g} s; --start-timeout)")
            if code == -1:
                return f"{host}: {why}"
            if code != 255 or time.monotonic() + RETRY_INTERVAL >= deadline:
                return f"{host}: ssh failed: {why}"
            time.sleep(RETRY_INTERVAL)

    with ThreadPoolExecutor(max_workers=min(32, len(hosts))) as pool:
        return [problem for problem in pool.map(probe, hosts) if problem]

"""A job that horovodishrun starts itself, without mpirun: ``--gloo`` (Horovod's command
lines), or a machine with no ``mpiexec``.

The launcher runs the job's PMI server (``horovodish.common.world``) and starts each
rank as its client: on this host as a child process, on another host over ssh. Every
rank gets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` and the
server's address; the job key reaches a remote rank through ssh's stdin, never a
command line. MPI is still the transport: ``init()`` forms one ``MPI_COMM_WORLD`` as
under mpirun.

As under mpirun: the exit code is the job's (the first rank that failed gives its code),
a rank that dies ends the others (the server tells them at once), SIGINT/SIGTERM go to
every rank and whatever is alive 5 s later is killed.
"""
from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence

from horovodish.common.world.driver_world import DriverWorld
from horovodish.common.world.launch_env import SECRET_VARIABLE

from .envvars import PREFIXES
from .hosts import Host
from .process import GRACE_SECONDS, exit_code
from .remote import Remote, is_local

# What a remote rank gets of this environment besides horovodish's own variables (ssh
# starts it with a fresh one): where Python and its libraries are, and the settings of
# MPI, its fabrics, NCCL, OpenMP and glibc that a user sets for a job.
FORWARDED = ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV", "GLIBC_TUNABLES",
             "THP_MEM_ALLOC_ENABLE", "CUDA_VISIBLE_DEVICES", "TF_USE_LEGACY_KERAS")
FORWARDED_PREFIXES = (*PREFIXES, "MPIR_CVAR_", "MPICH_", "FI_", "UCX_", "NCCL_", "OMP_",
                      "TORCH_", "JAX_", "XLA_", "TF_")
START_TIMEOUT = 60.0


def placement(num_proc: int, hosts: Sequence[Host] | None) -> list[str]:
    """The host of every rank: each host's slots in turn, in the order given (a host
    without a slot count takes one rank; alone, all of them)."""
    if not hosts:
        return ["localhost"] * num_proc
    if len(hosts) == 1 and hosts[0].slots is None:
        return [hosts[0].name] * num_proc
    names = [host.name for host in hosts for _ in range(host.slots or 1)]
    if len(names) < num_proc:
        raise ValueError(f"-np {num_proc} needs {num_proc} slots; the hosts give "
                         f"{len(names)}")
    return names[:num_proc]


def run(num_proc: int, hosts: Sequence[Host] | None, command: Sequence[str],
        config: Mapping[str, str], remote: Remote, verbose: bool = False) -> int:
    """Start the job and wait for it; its exit code (see the module docstring)."""
    try:
        where = placement(num_proc, hosts)
    except ValueError as exc:
        print(f"horovodishrun: {exc}", file=sys.stderr)
        return 2
    world = DriverWorld(num_proc, max(START_TIMEOUT, remote.start_timeout), "horovodishrun")
    job = _Job(world)
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, job.on_signal)
                    for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        for rank, host in enumerate(where):
            local = is_local(host)
            variables = {**config, **world.rank_env(
                rank, None if local else host, where[:rank].count(host), where.count(host),
                with_key=local)}
            if local:
                job.start_local(command, {**os.environ, **variables},
                                stdin=None if rank == 0 else subprocess.DEVNULL)
            else:
                argv = ssh_command(host, command, {**forwarded(os.environ), **variables},
                                   remote)
                if verbose:
                    print(shlex.join(argv), file=sys.stderr, flush=True)
                job.start_remote(argv, world.key)
        return job.wait()
    finally:
        job.end()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def forwarded(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``environ`` a remote rank gets (FORWARDED, FORWARDED_PREFIXES)."""
    return {name: value for name, value in environ.items()
            if name in FORWARDED or name.startswith(FORWARDED_PREFIXES)}


def ssh_command(host: str, command: Sequence[str], variables: Mapping[str, str],
                remote: Remote) -> list[str]:
    """ssh to ``host`` running ``command`` in this directory with ``variables``; the
    remote shell reads the job key from its stdin first."""
    assignments = " ".join(shlex.quote(f"{name}={value}")
                           for name, value in sorted(variables.items()))
    script = (f"cd {shlex.quote(os.getcwd())} && IFS= read -r {SECRET_VARIABLE} && "
              f"export {SECRET_VARIABLE} && exec env {assignments} "
              + " ".join(shlex.quote(part) for part in command))
    return ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
            *remote.ssh_options(), host, script]


class _Job:
    """The ranks' processes (children here, or the ssh clients of remote ones)."""

    def __init__(self, world: DriverWorld) -> None:
        self.world = world
        self.processes: list[subprocess.Popen] = []
        self.signals: list[int] = []
        self.deadline: float | None = None

    def start_local(self, command: Sequence[str], env: Mapping[str, str],
                    stdin: int | None) -> None:
        self.processes.append(subprocess.Popen(list(command), env=dict(env), stdin=stdin,
                                               process_group=0))

    def start_remote(self, argv: list[str], key: str) -> None:
        process = subprocess.Popen(argv, stdin=subprocess.PIPE, process_group=0)
        assert process.stdin is not None
        try:
            process.stdin.write(f"{key}\n".encode())
            process.stdin.close()
        except OSError:  # ssh failed at once; its exit code says why
            pass
        self.processes.append(process)

    def on_signal(self, signum: int, _frame: object) -> None:
        self.signals.append(signum)
        if len(self.signals) == 1:
            self.deadline = time.monotonic() + GRACE_SECONDS
            self._signal_all(signum)
        else:
            self._signal_all(signal.SIGKILL)

    def _signal_all(self, signum: int) -> None:
        for process in self.processes:
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signum)
                except (ProcessLookupError, PermissionError):
                    pass

    def wait(self) -> int:
        """Until every rank has ended; the first failure's exit code, else 0."""
        first_failure: int | None = None
        while any(process.poll() is None for process in self.processes):
            for process in self.processes:
                code = process.poll()
                if code not in (None, 0) and first_failure is None:
                    first_failure = exit_code(code)
                    # The server ends the others; whatever lingers goes after the grace.
                    self.deadline = self.deadline or time.monotonic() + GRACE_SECONDS
            if self.deadline is not None and time.monotonic() >= self.deadline:
                self._signal_all(signal.SIGKILL)
                self.deadline = time.monotonic() + GRACE_SECONDS
            time.sleep(0.05)
        if first_failure is None:
            first_failure = next((exit_code(p.returncode) for p in self.processes
                                  if p.returncode), 0)
        if self.signals and first_failure != 0:
            return 128 + self.signals[0]
        return first_failure

    def end(self) -> None:
        """Nothing left running: the ranks (if an exception got us here), the server."""
        self._signal_all(signal.SIGKILL)
        for process in self.processes:
            process.wait()
        try:
            self.world.wait(timeout=GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            self.world.stop()

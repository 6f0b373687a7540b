"""A real Slurm on the emulated cluster: slurmctld on h1, one slurmd per host, munge.

Why real daemons: what a scheduler does to a job (how srun starts ranks, which variables
it sets, what salloc and sbatch give the launcher, what a drained node means) is only
known by running it. Debian's ``slurm-wlm`` and ``munge`` packages are enough; nothing is
installed or changed outside the cluster's state directory:

* one munged (its key, socket and logs in the state directory; a unix socket, so every
  host reaches it through the shared file system) run on h1;
* slurm.conf in the state directory, named by ``SLURM_CONF`` in every command's
  environment; spool, state, pid and log files there too, per node where it matters;
* no cgroups (proctrack/linuxproc, task/none), ``MpiDefault=none`` (Slurm's default, so
  plain ``srun`` starts tasks without PMI), and a ``SlurmdTimeout`` far longer than the
  tests: whatever ends a job on a lost node is horovodish's doing, not Slurm's.

The daemons run inside the hosts' namespaces, so the cluster's teardown ends them with
everything else. ``assert_nothing_left`` checks that a job left nothing behind (the
daemons aside).

    with Cluster(hosts=2, prefix=...) as cluster:
        slurm = Slurm(cluster).up()
        slurm.run(["srun", "-N2", "-n4", "--mpi=pmi2", "python", "train.py"])
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .cluster import Cluster
from .jobs import assert_nothing_left

# The daemons that stay up between jobs (command names), and sshd (tests/cluster/sshd.py).
RESIDENTS = ("munged", "slurmctld", "slurmscriptd", "slurmd", "sshd")


def missing_slurm() -> str | None:
    """Why a Slurm cannot be built here (None: it can)."""
    for tool in ("slurmctld", "slurmd", "srun", "sbatch", "munged"):
        if shutil.which(tool) is None and not Path("/usr/sbin", tool).exists():
            return (f"the Slurm tests need {tool}: apt-get install -y slurm-wlm munge "
                    "(.ci/run installs them when it runs as root)")
    return None


class Slurm:
    """A Slurm cluster on ``cluster``'s hosts, each with ``cpus`` CPUs; see the module
    docstring."""

    def __init__(self, cluster: Cluster, cpus: int = 2) -> None:
        self.cluster, self.cpus = cluster, cpus
        self.state = cluster.state / "slurm"
        self.conf = self.state / "slurm.conf"
        self._daemons: list[subprocess.Popen] = []

    def env(self, **extra: str) -> dict[str, str]:
        """Environment for commands on the hosts: the cluster's, plus ``SLURM_CONF``, this
        Python's bin/ on PATH (as a user who activated the virtualenv has: batch scripts
        call horovodishrun and horovodish-slurm-hosts by name) and unbuffered output."""
        env = self.cluster.env(SLURM_CONF=str(self.conf), PYTHONUNBUFFERED="1", **extra)
        env["PATH"] = f"{env['PATH']}:{Path(sys.executable).parent}"
        return env

    def up(self, timeout: float = 30.0) -> "Slurm":
        """Write the configuration, start the daemons, wait until every node is idle."""
        state = self.state
        for sub in ("ctld", "spool", "log"):
            (state / sub).mkdir(parents=True, exist_ok=True)
        key = state / "munge.key"
        key.write_bytes(os.urandom(128))
        key.chmod(0o600)
        self.conf.write_text(self._configuration())
        self._start("h1", ["munged", "--foreground", "--force", f"--key-file={key}",
                           f"--socket={state / 'munge.socket'}",
                           f"--pid-file={state / 'munged.pid'}",
                           f"--seed-file={state / 'munge.seed'}",
                           f"--log-file={state / 'log' / 'munged.log'}"])
        self._wait_for(lambda: (state / "munge.socket").exists(), 10, "munged's socket")
        self._start("h1", ["slurmctld", "-D", "-i"])
        for host in self.cluster.hosts:
            self._start(host, ["slurmd", "-D"])
        self._wait_for(lambda: self.node_states() == {h: "idle" for h in self.cluster.hosts},
                       timeout, "every node idle")
        return self

    def _configuration(self) -> str:
        hosts = self.cluster.hosts
        state = self.state
        return "\n".join([
            "ClusterName=emulated",
            f"SlurmctldHost={hosts[0]}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            f"AuthInfo=socket={state / 'munge.socket'}",
            "CredType=cred/munge",
            f"StateSaveLocation={state / 'ctld'}",
            f"SlurmdSpoolDir={state / 'spool'}/%n",
            f"SlurmctldPidFile={state / 'slurmctld.pid'}",
            f"SlurmdPidFile={state / 'spool'}/slurmd-%n.pid",
            f"SlurmctldLogFile={state / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={state / 'log'}/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "MpiDefault=none",
            "SlurmdTimeout=600",
            "InactiveLimit=0",
            "KillWait=5",
            "ReturnToService=2",
            "SlurmdParameters=config_overrides",
            f"NodeName={','.join(hosts)} CPUs={self.cpus} State=UNKNOWN",
            "PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
            ""])

    def _start(self, host: str, argv: list[str]) -> None:
        log = open(self.state / "log" / f"{argv[0]}-{host}.out", "ab")
        with log:
            self._daemons.append(subprocess.Popen(
                self.cluster.on_host(host, argv), env=self.env(), stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True))

    def _wait_for(self, ready, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            dead = [p.args[3:5] for p in self._daemons if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(f"Slurm did not come up ({what}); "
                                   + (f"ended: {dead}; " if dead else "")
                                   + f"logs in {self.state / 'log'}:\n{self.logs()}")
            time.sleep(0.1)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} ---\n{p.read_text(errors='replace')[-3000:]}"
                         for p in sorted((self.state / "log").iterdir()))

    # -- use ------------------------------------------------------------------------
    def run(self, argv: list, host: str = "h1", timeout: float = 120,
            cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess:
        """Run argv (srun, salloc, sbatch ...) on host, output merged."""
        return self.cluster.run(host, [str(a) for a in argv], env=self.env(**env),
                                timeout=timeout, cwd=cwd)

    def batch(self, argv: list, timeout: float = 180, **env: str
              ) -> tuple[int, str]:
        """``sbatch --parsable argv``, then wait for the job to end: (its exit code, its
        state). Polled five times a second: ``sbatch --wait`` polls at up to 10 s and
        more, which a short job would spend waiting."""
        done = self.run(["sbatch", "--parsable", *argv], timeout=60, **env)
        if done.returncode != 0:
            raise AssertionError(f"sbatch failed: {done.stdout}")
        job = done.stdout.strip().split(";")[0]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            fields = dict(item.split("=", 1) for item in
                          self.scontrol("show", "job", job, "-o").split() if "=" in item)
            state = fields.get("JobState", "UNKNOWN")
            if state not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED"):
                return int(fields.get("ExitCode", "255:0").split(":")[0]), state
            time.sleep(0.2)
        self.run(["scancel", job], timeout=30)
        raise AssertionError(f"batch job {job} still running after {timeout} s")

    def scontrol(self, *args: str) -> str:
        done = self.run(["scontrol", *args], timeout=30)
        if done.returncode != 0:
            raise RuntimeError(f"scontrol {' '.join(args)}: {done.stdout}")
        return done.stdout

    def node_states(self) -> dict[str, str]:
        """{node: sinfo's short state (idle, alloc, mix, drain, drng, down ...)}."""
        done = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], timeout=30)
        return dict(line.split() for line in done.stdout.splitlines() if line.strip())

    def drain(self, node: str, reason: str = "test") -> None:
        self.scontrol("update", f"nodename={node}", "state=drain", f"reason={reason}")

    def resume(self, node: str) -> None:
        """Put a drained or down node back into service (nothing if it is in service)."""
        if self.node_states().get(node, "").startswith(("drain", "drng", "down")):
            self.scontrol("update", f"nodename={node}", "state=resume")

    def cancel_all(self) -> None:
        self.run(["scancel", "--full", "--user=root"], timeout=30)

    def jobs(self) -> list[str]:
        done = self.run(["squeue", "-h", "-o", "%i %T"], timeout=30)
        return [line for line in done.stdout.splitlines() if line.strip()]

    def assert_nothing_left(self, within: float = 20.0) -> None:
        """No job in the queue and no job process on any host within ``within`` seconds
        (the daemons aside); else everything is cancelled, killed, and the test fails."""
        deadline = time.monotonic() + within
        while self.jobs() and time.monotonic() < deadline:
            time.sleep(0.3)
        jobs = self.jobs()
        if jobs:
            self.cancel_all()
        assert_nothing_left(self.cluster, max(1.0, deadline - time.monotonic()), RESIDENTS)
        assert not jobs, f"jobs left in the queue: {jobs}"

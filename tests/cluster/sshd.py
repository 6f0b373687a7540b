"""OpenSSH's sshd on every host of an emulated cluster, set up the way an MPI Operator
job's pods are: sshd on port 2222, one key pair whose public half every host accepts,
and a client configuration that names the port and key and asks no host-key question.

Why real sshd rather than the cluster's ssh stand-in (tests/cluster/bin/ssh): the
Kubernetes contract is plain ``ssh host`` with whatever the image configured, reaching
hosts that may come up late; only the real client and server show what that does.
Nothing outside the cluster's state directory changes: the client configuration is
bind-mounted over /etc/ssh/ssh_config inside the hosts (bin/on-host does it when the
state has one), the keys and sshd's configuration live in the state directory, and the
daemons run in the hosts' namespaces (the cluster's teardown ends them).

Commands that should use it run with ``env()``: the cluster's variables without the
stand-in on PATH.
"""
from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from .cluster import Cluster

PORT = 2222
SSHD = "/usr/sbin/sshd"


def missing_sshd() -> str | None:
    if not Path(SSHD).exists() or shutil.which("ssh-keygen") is None:
        return "the ssh tests need openssh-server: apt-get install -y openssh-server"
    return None


class Sshd:
    """sshd on each of ``cluster``'s hosts; see the module docstring."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.dir = cluster.state / "sshd"
        self.key = self.dir / "id_ed25519"
        self._daemons: dict[str, subprocess.Popen] = {}

    def up(self) -> "Sshd":
        self.dir.mkdir(parents=True, exist_ok=True)
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation
        for key in (self.dir / "host_key", self.key):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)],
                           check=True, capture_output=True)
        shutil.copy(f"{self.key}.pub", self.dir / "authorized_keys")
        (self.dir / "sshd_config").write_text("\n".join([
            f"Port {PORT}", f"HostKey {self.dir / 'host_key'}",
            f"AuthorizedKeysFile {self.dir / 'authorized_keys'}",
            "PermitRootLogin prohibit-password", "PasswordAuthentication no",
            "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes no",
            "PidFile none", "LogLevel INFO", ""]))
        # The client side of an MPI Operator image: the port, the key, no questions.
        (self.cluster.state / "ssh_config").write_text("\n".join([
            "Host *", f"    Port {PORT}", f"    IdentityFile {self.key}",
            "    StrictHostKeyChecking no", "    UserKnownHostsFile /dev/null",
            "    LogLevel ERROR", ""]))
        for host in self.cluster.hosts:
            self.start(host)
        return self

    def env(self, **extra: str) -> dict[str, str]:
        """The cluster's environment with the real ssh (no stand-in first on PATH)."""
        env = self.cluster.env(**extra)
        env["PATH"] = env["PATH"].split(":", 1)[1]
        return env

    def start(self, host: str, timeout: float = 10.0) -> None:
        """Start host's sshd and wait until it accepts a login."""
        log = open(self.dir / f"sshd-{host}.log", "ab")
        with log:
            self._daemons[host] = subprocess.Popen(
                self.cluster.on_host(host, [SSHD, "-D", "-e", "-f",
                                            str(self.dir / "sshd_config")]),
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            done = self.cluster.run(host, ["ssh", "-o", "BatchMode=yes", host, "true"],
                                    env=self.env(), timeout=timeout)
            if done.returncode == 0:
                return
            if time.monotonic() > deadline or self._daemons[host].poll() is not None:
                raise RuntimeError(f"sshd on {host} did not come up: {done.stdout}"
                                   f"{(self.dir / f'sshd-{host}.log').read_text()}")
            time.sleep(0.1)

    def logins(self, host: str) -> int:
        """Logins host's sshd accepted so far (its log's "Accepted publickey" lines)."""
        log = self.dir / f"sshd-{host}.log"
        return log.read_text(errors="replace").count("Accepted publickey for root")

    @property
    def running(self) -> list[str]:
        return [host for host, daemon in self._daemons.items() if daemon.poll() is None]

    def stop(self, host: str) -> None:
        """Stop host's sshd (sessions it started go on, as after a restart)."""
        daemon = self._daemons.pop(host)
        daemon.kill()
        daemon.wait()

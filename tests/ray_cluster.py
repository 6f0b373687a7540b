"""Real Ray clusters for the tests: ``ray start --block`` for a head (and for workers
joining it), on this host or on an emulated host, each in its own temporary directory,
and a teardown that leaves no Ray process behind (``ray start --block`` ends what it
started on SIGTERM, but not all of it: what is left is found by its directory).

    head = RayNode.head(num_cpus=2)
    run_driver(head.address, "executor", "--workers", "2")
    head.stop()
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

from horovodish.launcher.process import kill_tree
from multirank import free_port, run_command

RAY = [sys.executable, "-m", "ray.scripts.scripts"]
# Clusters that live only for a test session, on addresses no one else reaches.
ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
       "RAY_TRAIN_ENABLE_PRINT_PATCH": "0"}
DRIVER = Path(__file__).parent / "ray" / "ray_driver.py"


class RayNode:
    """One ``ray start --block`` process (a head, or a worker node joining one)."""

    def __init__(self, argv: list[str], temp_dir: str, address: str,
                 env: dict[str, str]) -> None:
        self.temp_dir, self.address = temp_dir, address
        self.log = open(Path(temp_dir) / "node.log", "wb")
        self.process = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                                        stdout=self.log, stderr=subprocess.STDOUT,
                                        start_new_session=True)

    @classmethod
    def head(cls, num_cpus: int, on: Sequence[str] = (), ip: str = "127.0.0.1",
             env: dict[str, str] | None = None, num_gpus: int = 0) -> "RayNode":
        temp_dir = tempfile.mkdtemp(prefix="hvdray-")
        port = free_port()
        argv = [*on, *RAY, "start", "--head", "--block", f"--num-cpus={num_cpus}",
                f"--num-gpus={num_gpus}", f"--port={port}", f"--node-ip-address={ip}",
                "--include-dashboard=false", f"--temp-dir={temp_dir}",
                "--object-store-memory=200000000", "--disable-usage-stats"]
        node = cls(argv, temp_dir, f"{ip}:{port}", {**os.environ, **ENV, **(env or {})})
        node.wait_until_up()
        return node

    @classmethod
    def worker(cls, address: str, num_cpus: int, on: Sequence[str], ip: str,
               env: dict[str, str] | None = None) -> "RayNode":
        temp_dir = tempfile.mkdtemp(prefix="hvdray-")
        argv = [*on, *RAY, "start", "--block", f"--address={address}",
                f"--num-cpus={num_cpus}", f"--node-ip-address={ip}",
                "--object-store-memory=100000000", "--disable-usage-stats"]
        return cls(argv, temp_dir, address, {**os.environ, **ENV, **(env or {})})

    def wait_until_up(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        log = Path(self.temp_dir) / "node.log"
        while "This command will now block" not in log.read_text(errors="replace"):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"ray start did not come up:\n{log.read_text()}")
            time.sleep(0.2)

    def stop(self) -> None:
        """End this node and everything it started."""
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(timeout=5)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        kill_tree(self.process.pid)
        deadline = time.monotonic() + 15
        while processes_of(self.temp_dir) and time.monotonic() < deadline:
            for pid in processes_of(self.temp_dir):  # (a dying raylet may start more)
                kill_tree(pid)
            time.sleep(0.2)
        self.log.close()


def processes_of(marker: str) -> list[int]:
    """Processes whose command line names ``marker`` (a node's temporary directory)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if marker.encode() in cmdline:
            found.append(int(entry))
    return found


def ray_processes() -> list[str]:
    """Ray's daemons and workers running anywhere on this machine."""
    out = subprocess.run(["pgrep", "-af", "raylet|gcs_server|ray::|default_worker.py"],
                         capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "pgrep" not in line]


def run_driver(address: str, *args: str, on: Sequence[str] = (), env: dict | None = None,
               timeout: float = 300) -> dict:
    """Run tests/ray/ray_driver.py against the cluster; its RESULT (asserted present)."""
    import json
    result = run_command([*on, sys.executable, DRIVER, address, *args],
                         env={**ENV, **(env or {})}, timeout=timeout)
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert result.returncode == 0 and lines, result.stdout[-20000:]
    outcome = json.loads(lines[-1][len("RESULT "):])
    outcome["output"] = result.stdout
    return outcome

"""Start a job's PMI server as a process of its own (see ``pmi_server``), for rank 0 or
for a driver (horovodishrun without mpirun, Ray, Spark).

The configuration, job key included, goes through the child's stdin, never its command
line (which every user of the host can read). The child stays in its starter's process
group, so a launcher that kills the group kills it too; it ends by itself when the job's
ranks are gone.
"""
from __future__ import annotations

import json
import select
import subprocess
import sys
import time
from dataclasses import asdict

from .pmi_server import ServerConfig

START_SECONDS = 30.0


class ServerProcess:
    """A running PMI server: its port, and the process to wait for or stop."""

    def __init__(self, process: subprocess.Popen, port: int) -> None:
        self.process, self.port = process, port

    @classmethod
    def start(cls, config: ServerConfig, timeout: float = START_SECONDS) -> "ServerProcess":
        """Start the server and wait until it listens. OSError when it cannot listen
        (every candidate port taken, say), naming why."""
        process = subprocess.Popen(
            [sys.executable, "-m", "horovodish.common.world.serve"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, close_fds=True)
        assert process.stdin is not None and process.stdout is not None
        data = asdict(config)
        data["ports"] = list(config.ports)
        process.stdin.write(json.dumps(data) + "\n")
        process.stdin.close()
        deadline = time.monotonic() + timeout
        line = ""
        while not line.endswith("\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([process.stdout], [], [], left)[0]:
                process.kill()
                raise OSError(f"the PMI server did not start within {timeout:g} s")
            chunk = process.stdout.readline()
            if not chunk:
                break
            line += chunk
        process.stdout.close()
        try:
            answer = json.loads(line)
        except ValueError:
            process.kill()
            raise OSError(f"the PMI server failed to start (exit code {process.wait()})") \
                from None
        if "port" not in answer:
            process.wait()
            raise OSError(f"the PMI server cannot listen: {answer.get('error')}")
        return cls(process, int(answer["port"]))

    def wait(self, timeout: float | None = None) -> int:
        return self.process.wait(timeout)

    def stop(self) -> None:
        """End the server now (a driver whose job failed to start)."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

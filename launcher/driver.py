"""The elastic launcher's notice board: a small TCP server the ranks report to.

Why: after mpirun ends, the launcher must know why (mpirun's exit code says only that
something failed) to choose where the next job runs, and during a job rank 0 asks it at
every commit whether the hosts changed. The messages (one JSON line per connection, from
horovodish/common/runtime/launcher_link.py):

* ``exit`` from the rank wrapper (rank_wrapper.py) when its rank ended non-zero: the
  exit code, or the signal that killed it;
* ``error`` from a rank's excepthook: the exception that ended the script;
* ``lost`` from the heartbeat (runtime/heartbeat.py): the ranks of a host it lost;
* ``commit`` from rank 0 at each commit: answered with whether the hosts changed (and
  then this generation is marked as stopping to restart).

Each message carries the job's token (a random string only the job's environment holds)
and its generation; others are ignored, so a late report from an old job never counts
for the current one.
"""
from __future__ import annotations

import json
import secrets
import socketserver
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Reports:
    """What the ranks of one generation said, in arrival order."""

    exits: list[dict[str, Any]] = field(default_factory=list)
    errors: dict[int, str] = field(default_factory=dict)
    lost: list[dict[str, Any]] = field(default_factory=list)
    commit_seq: int | None = None   # the last commit rank 0 reported
    first_commit_at: float | None = None
    restart: bool = False           # rank 0 was told at a commit that hosts changed


class Driver:
    """Serve on ``bind`` (all interfaces by default) until ``close``; ``hosts_changed``
    answers rank 0's question at each commit."""

    def __init__(self, hosts_changed: Callable[[], bool], bind: str = "") -> None:
        self.token = secrets.token_hex(16)
        self.hosts_changed = hosts_changed
        self._lock = threading.Lock()
        self._reports: dict[int, Reports] = {}
        driver = self

        class Handler(socketserver.StreamRequestHandler):
            timeout = 10

            def handle(self) -> None:
                try:
                    message = json.loads(self.rfile.readline(1 << 20) or b"{}")
                except ValueError:
                    return
                if not isinstance(message, dict) or message.get("token") != driver.token:
                    return
                reply = driver._take(message)
                self.wfile.write(json.dumps(reply).encode() + b"\n")

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._server = Server((bind, 0), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="horovodishrun-driver", daemon=True)
        self._thread.start()

    def reports(self, generation: int) -> Reports:
        with self._lock:
            return self._reports.setdefault(generation, Reports())

    def _take(self, message: dict[str, Any]) -> dict[str, Any]:
        kind = message.get("kind")
        generation = int(message.get("generation") or 0)
        with self._lock:
            reports = self._reports.setdefault(generation, Reports())
            if kind == "exit":
                reports.exits.append(message)
            elif kind == "error":
                reports.errors.setdefault(int(message.get("rank", -1)),
                                          str(message.get("text", "")))
            elif kind == "lost":
                reports.lost.append(message)
            elif kind == "commit":
                reports.commit_seq = int(message.get("seq") or 0)
                if reports.first_commit_at is None:
                    reports.first_commit_at = time.monotonic()
                if not reports.restart and self.hosts_changed():
                    reports.restart = True
                return {"hosts_changed": reports.restart}
        return {}

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

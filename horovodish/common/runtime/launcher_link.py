"""The ranks' side of the elastic launcher's notice board (launcher/driver.py).

Why: when a job fails, the launcher must know what was lost (a rank killed on host X, a
host out of reach, or an error in the script) to choose where to start again, and at
each commit rank 0 asks it whether hosts were added. mpirun tells neither. Each message
is one JSON line over a TCP connection of its own to ``HOROVODISH_ELASTIC_DRIVER``
(host:port, set by horovodishrun for elastic jobs), carrying the job's token and the
generation (the launcher's count of starts), so a late message from an old generation
is never taken for the current one. Stdlib only: the rank wrapper uses it too.
"""
from __future__ import annotations

import json
import os
import socket
from typing import Any

ENV_DRIVER = "HOROVODISH_ELASTIC_DRIVER"
ENV_TOKEN = "HOROVODISH_ELASTIC_TOKEN"
ENV_GENERATION = "HOROVODISH_ELASTIC_GENERATION"
# When the launcher started this generation (seconds since the epoch): recovery times
# in docs/tuning.md are measured from it.
ENV_LAUNCHED_AT = "HOROVODISH_ELASTIC_LAUNCHED_AT"


def enabled() -> bool:
    """Whether this process runs under horovodishrun's elastic mode."""
    return bool(os.environ.get(ENV_DRIVER))


def generation() -> int:
    """The launcher's count of starts of this job (1 for the first; 0: not elastic):
    the elastic horovodishrun's, or torchrun's restarts plus one."""
    if os.environ.get(ENV_GENERATION):
        return int(os.environ[ENV_GENERATION])
    restarts = os.environ.get("TORCHELASTIC_RESTART_COUNT", "")
    return int(restarts) + 1 if restarts.isdigit() else 0


def world_rank() -> int:
    """This process's rank as its launcher numbered it (-1 when not started by one)."""
    for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "RANK", "SLURM_PROCID"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return -1


def request(message: dict[str, Any], timeout: float = 5.0) -> dict[str, Any] | None:
    """Send message, return the launcher's answer (None when not elastic). Raises
    OSError when the launcher cannot be reached within timeout."""
    address = os.environ.get(ENV_DRIVER)
    if not address:
        return None
    host, _, port = address.rpartition(":")
    body = {**message, "token": os.environ.get(ENV_TOKEN, ""), "generation": generation()}
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(json.dumps(body).encode() + b"\n")
        reply = b""
        while not reply.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            reply += chunk
    return json.loads(reply) if reply.strip() else {}


def notify(message: dict[str, Any], timeout: float = 2.0) -> None:
    """request() for a process about to end: errors are swallowed (the launcher may be
    out of reach, which is often why the process ends)."""
    try:
        request(message, timeout)
    except (OSError, ValueError):
        pass

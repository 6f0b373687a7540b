"""The PMI server's process (``python -m horovodish.common.world.serve``; see
``pmi_server`` for what it serves and ``server_process`` for who starts it)."""
from __future__ import annotations

import json
import signal
import sys

from .pmi_server import PmiServer, ServerConfig


def main() -> int:
    """Read the configuration (one JSON line) from stdin, listen, say the port (or the
    error) on stdout as one JSON line, close stdout, serve."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the ranks' end ends the server
    config = ServerConfig.from_json(sys.stdin.readline())
    server = PmiServer(config)
    try:
        port = server.bind()
    except OSError as exc:
        sys.stdout.write(json.dumps({"error": str(exc)}) + "\n")
        return 1
    sys.stdout.write(json.dumps({"port": port}) + "\n")
    sys.stdout.flush()
    sys.stdout.close()
    return server.serve()


if __name__ == "__main__":
    sys.exit(main())

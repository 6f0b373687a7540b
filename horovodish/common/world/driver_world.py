"""A world whose PMI server runs in a driver: horovodishrun without mpirun, Ray's
executor and Train backend, Spark's ``run``. The driver starts the server and hands
each rank, however it starts it, the variables that make ``init()`` join it (the
``driver`` launch of ``launch_env``)."""
from __future__ import annotations

import secrets

from .launch_env import RUN_ID_VARIABLE, SECRET_VARIABLE, SERVER_VARIABLE
from .pmi_server import ServerConfig
from .rendezvous import addresses_toward
from .server_process import ServerProcess


class DriverWorld:
    """One job's server, started in this process; ``rank_env`` for each rank."""

    def __init__(self, size: int, start_timeout: float, launcher: str,
                 run_id: str | None = None) -> None:
        self.size, self.launcher = size, launcher
        self.key = secrets.token_hex(16)
        self.run_id = run_id or f"{launcher}-{secrets.token_hex(6)}"
        self.server = ServerProcess.start(ServerConfig(size, self.key, self.run_id,
                                                       start_timeout))

    def address_for(self, host: str | None) -> str:
        """The server's address as a rank on ``host`` reaches it (None: this host)."""
        where = "127.0.0.1" if host is None else addresses_toward(host)[0]
        return f"{where}:{self.server.port}"

    def rank_env(self, rank: int, host: str | None = None, local_rank: int | None = None,
                 local_size: int | None = None, with_key: bool = True) -> dict[str, str]:
        """What rank ``rank`` needs in its environment before horovodish is imported
        there. ``with_key=False`` leaves the job key out, for a channel that others can
        read (a command line): give it as HOROVODISH_SECRET another way."""
        env = {"RANK": str(rank), "WORLD_SIZE": str(self.size),
               SERVER_VARIABLE: self.address_for(host), RUN_ID_VARIABLE: self.run_id,
               "HOROVODISH_LAUNCHER": self.launcher}
        if local_rank is not None:
            env["LOCAL_RANK"] = str(local_rank)
        if local_size is not None:
            env["LOCAL_WORLD_SIZE"] = str(local_size)
        if with_key:
            env[SECRET_VARIABLE] = self.key
        return env

    def wait(self, timeout: float | None = None) -> int:
        """The server's exit code once the job is over (1 after an abort)."""
        return self.server.wait(timeout)

    def stop(self) -> None:
        self.server.stop()

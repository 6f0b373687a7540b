"""The actor every rank of a Ray job runs in (Horovod's ``BaseHorovodWorker``).

A fresh process per rank: its environment gets the world's variables (``join_world``)
before anything imports ``mpi4py.MPI`` in it, so ``init()`` joins the job's PMI server
in the driver. Nothing here imports MPI at module import for the same reason.
"""
from __future__ import annotations

import os
import socket
from typing import Any, Callable

from ..common.world.mpi_start import defer_import_start


class BaseHorovodWorker:
    """One rank: an optional executable object, and functions run on it."""

    executable: Any = None

    def __init__(self, world_rank: int = 0, world_size: int = 1) -> None:
        import ray
        os.environ["HOROVOD_HOSTNAME"] = ray.get_runtime_context().get_node_id()
        os.environ["HOROVOD_RANK"], os.environ["HOROVOD_SIZE"] = str(world_rank), str(world_size)

    def node_id(self) -> str:
        import ray
        return ray.get_runtime_context().get_node_id()

    def node_ip(self) -> str:
        import ray
        return ray.util.get_node_ip_address()

    def hostname(self) -> str:
        return socket.gethostname()

    def get_gpu_ids(self) -> list:
        import ray
        return list(ray.get_gpu_ids())

    def update_env_vars(self, env_vars: dict[str, Any]) -> None:
        os.environ.update({key: str(value) for key, value in env_vars.items()})

    def env_vars(self) -> dict[str, str]:
        return dict(os.environ)

    def join_world(self, env_vars: dict[str, Any]) -> int:
        return join_world(env_vars)

    def leave(self) -> None:
        leave()

    def start_executable(self, executable_cls: type | None = None,
                         executable_args: list | None = None,
                         executable_kwargs: dict | None = None) -> None:
        if executable_cls is not None:
            self.executable = executable_cls(*(executable_args or []),
                                             **(executable_kwargs or {}))

    def execute(self, func: Callable[[Any], Any]) -> Any:
        return func(self.executable)

    def run_elastic(self, func: Callable[[], Any]) -> Any:
        """``func()`` for an elastic generation: leaving for a restart on more hosts
        (``sys.exit(0)`` at a commit) returns RESTART instead of ending the actor."""
        try:
            return func()
        except SystemExit as exc:
            if exc.code in (0, None):
                return RESTART
            raise


RESTART = "horovodish.ray:restart-on-new-hosts"


def join_world(env_vars: dict[str, Any]) -> int:
    """Take the world's variables, then ``init()``: every rank of the job blocks here
    until all have arrived. Returns this rank."""
    os.environ.update({key: str(value) for key, value in env_vars.items()})
    defer_import_start(os.environ)
    from ..common import api
    api.init()
    return api.rank()


def leave() -> None:
    """The driver ends the job: the others' end is no news here."""
    from ..common.world import membership
    membership.expect_end()

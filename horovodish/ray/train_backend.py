"""A Ray Train backend: ``DataParallelTrainer(train_loop, backend_config=
HorovodishConfig(), scaling_config=ScalingConfig(num_workers=N))`` gives every worker
one horovodish world, for torch, TensorFlow and JAX alike, before ``train_loop`` runs
(which may call ``hvd.init()`` again: it is a no-op there).

``on_start`` runs in Ray Train's controller (on the driver's node): it starts the job's
PMI server there and has each worker join it, ranks as Ray Train numbered them. Ray
Train's checkpoints and ``ray.train.report`` work as with any backend.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ray.train.backend import Backend, BackendConfig

from ..common.world.driver_world import DriverWorld
from .worker import join_world, leave


@dataclass
class HorovodishConfig(BackendConfig):
    """``start_timeout``: seconds for every worker to join the world."""

    start_timeout: float = 60.0

    @property
    def backend_cls(self) -> type:
        return HorovodishBackend


class HorovodishBackend(Backend):
    """See the module docstring."""

    def on_start(self, worker_group: Any, backend_config: HorovodishConfig) -> None:
        import ray
        hosts = _worker_ips(worker_group)
        self._world = DriverWorld(len(hosts), backend_config.start_timeout, "Ray Train")
        envs = [self._world.rank_env(rank, host, hosts[:rank].count(host), hosts.count(host))
                for rank, host in enumerate(hosts)]
        ray.get([worker_group.execute_single_async(rank, join_world, env)
                 for rank, env in enumerate(envs)])

    def on_shutdown(self, worker_group: Any, backend_config: HorovodishConfig) -> None:
        world = getattr(self, "_world", None)
        if world is None:
            return
        try:
            worker_group.execute(leave)  # the workers' end is no news to them
        finally:
            world.stop()
            self._world = None


def _worker_ips(worker_group: Any) -> list[str]:
    """Each worker's node IP, by world rank (Ray Train V2's worker group, or V1's)."""
    workers = worker_group.get_workers() if hasattr(worker_group, "get_workers") \
        else worker_group.workers
    return [worker.metadata.node_ip for worker in workers]

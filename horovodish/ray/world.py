"""A set of Ray actors made one horovodish world: the PMI server in the driver, each
actor told its rank (node by node), its host's GPUs and the server's address, then
``init()`` on all of them at once."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..common.world.driver_world import DriverWorld
from .worker import BaseHorovodWorker


@dataclass
class ActorWorld:
    """The actors of one world in rank order, and its server."""

    workers: list[Any]
    world: DriverWorld
    hosts: list[str]          # each rank's node IP

    def kill(self) -> None:
        import ray
        try:  # (a worker that died meanwhile answers with an error: it is gone anyway)
            ray.get([worker.leave.remote() for worker in self.workers], timeout=10)
        except Exception:  # noqa: BLE001
            pass
        for worker in self.workers:
            ray.kill(worker, no_restart=True)
        self.world.stop()


def start(options: list[dict[str, Any]], timeout_s: float, use_gpu: bool,
          extra_env: dict[str, Any] | None = None, launcher: str = "Ray",
          env_for: Any = None) -> ActorWorld:
    """Start one actor per entry of ``options`` (Ray's actor options) and form their
    world. Raises what
    went wrong, with every actor it started killed. ``env_for(rank, host)``: more
    variables for a rank on node ``host`` (an elastic job's)."""
    import ray
    remote = ray.remote(BaseHorovodWorker)
    size = len(options)
    actors = [remote.options(**option).remote(index, size)
              for index, option in enumerate(options)]
    world = None
    try:
        nodes = ray.get([actor.node_id.remote() for actor in actors])
        ips = ray.get([actor.node_ip.remote() for actor in actors])
        first_seen = {node: i for i, node in reversed(list(enumerate(nodes)))}
        order = sorted(range(size), key=lambda i: (first_seen[nodes[i]], i))
        workers = [actors[i] for i in order]
        hosts = [ips[i] for i in order]
        node_of = [nodes[i] for i in order]
        gpus = _visible_devices(workers, node_of) if use_gpu else {}
        world = DriverWorld(size, timeout_s, launcher)
        envs = []
        for rank, node in enumerate(node_of):
            env = world.rank_env(rank, hosts[rank], node_of[:rank].count(node),
                                 node_of.count(node))
            env.update({"HOROVOD_RANK": rank, "HOROVOD_SIZE": size, **(extra_env or {}),
                        **(env_for(rank, hosts[rank]) if env_for else {})})
            if use_gpu:
                env["CUDA_VISIBLE_DEVICES"] = gpus[node]
            envs.append(env)
        ray.get([worker.join_world.remote(env) for worker, env in zip(workers, envs)],
                timeout=timeout_s + 30)
        return ActorWorld(workers, world, hosts)
    except BaseException:
        for actor in actors:
            ray.kill(actor, no_restart=True)
        if world is not None:
            world.stop()
        raise


def _visible_devices(workers: list[Any], nodes: list[str]) -> dict[str, str]:
    """Each node's CUDA_VISIBLE_DEVICES: every GPU Ray gave its workers, so that a
    worker picks its own by local rank (as Horovod's executor does)."""
    import ray
    ids = ray.get([worker.get_gpu_ids.remote() for worker in workers])
    per_node: dict[str, list[str]] = {}
    for node, got in zip(nodes, ids):
        per_node.setdefault(node, []).extend(str(i) for i in got)
    return {node: ",".join(sorted(set(found), key=found.index))
            for node, found in per_node.items()}

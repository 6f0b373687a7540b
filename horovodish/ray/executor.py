"""``RayExecutor``: Horovod's API for running a horovodish job on Ray actors.

    settings = RayExecutor.create_settings(timeout_s=30)
    executor = RayExecutor(settings, num_workers=4, cpus_per_worker=1)
    executor.start()
    results = executor.run(train, kwargs={"epochs": 2})   # one value per rank, rank order
    executor.shutdown()

``num_workers`` packs the workers onto as few nodes as fit; ``num_hosts`` x
``num_workers_per_host`` puts that many on each of that many nodes. The workers form one
world in ``start()`` (the PMI server runs in this driver); every function then runs on
all of them. With ``min_workers`` (and ``max_workers``) the job is elastic: see
``elastic.py``.
"""
from __future__ import annotations

import os
import stat
from typing import Any, Callable

from . import placement, world
from .elastic import ElasticJob, discovery_of
from .settings import Settings


class RayExecutor:
    """See the module docstring."""

    @classmethod
    def create_settings(cls, timeout_s: int = 30, ssh_identity_file: str | None = None,
                        ssh_str: str | None = None, placement_group_timeout_s: int = 100,
                        nics: set | None = None) -> Settings:
        """Settings for the executor: ``timeout_s`` bounds the workers' start."""
        if ssh_str and ssh_identity_file and not os.path.exists(ssh_identity_file):
            with open(ssh_identity_file, "w") as out:
                out.write(ssh_str)
            os.chmod(ssh_identity_file, stat.S_IRUSR | stat.S_IWUSR)
        return Settings(nics=set(nics) if nics else None, ssh_identity_file=ssh_identity_file,
                        timeout_s=timeout_s, placement_group_timeout_s=placement_group_timeout_s)

    def __init__(self, settings: Settings, num_workers: int | None = None,
                 num_hosts: int | None = None, num_workers_per_host: int = 1,
                 cpus_per_worker: float = 1, use_gpu: bool = False,
                 gpus_per_worker: int | None = None, use_current_placement_group: bool = True,
                 min_workers: int | None = None, max_workers: int | None = None,
                 reset_limit: int | None = None, cooldown_range: list[int] | None = None,
                 elastic_timeout: int = 600, override_discovery: bool = True,
                 num_slots: int | None = None, cpus_per_slot: float | None = None,
                 gpus_per_slot: int | None = None) -> None:
        # Horovod 0.21's names, which its examples/ray/tensorflow2_mnist_ray.py still uses:
        # num_hosts x num_slots workers, cpus_per_slot and gpus_per_slot each.
        if num_slots is not None:
            num_workers_per_host = num_slots
        if cpus_per_slot is not None:
            cpus_per_worker = cpus_per_slot
        if gpus_per_slot is not None:
            gpus_per_worker = gpus_per_slot
        if max_workers is not None and (not min_workers or min_workers <= 0):
            raise ValueError("`max_workers` provided without any positive `min_workers`: "
                             "elastic workloads require a positive `min_workers`")
        if min_workers is not None and num_workers is not None:
            raise ValueError("Both `min_workers` and `num_workers` provided. Only one of "
                             "the above is allowed as workloads cannot be elastic and "
                             "non-elastic.")
        if num_workers is not None and num_hosts is not None:
            raise ValueError("give num_workers, or num_hosts with num_workers_per_host, "
                             "not both")
        if gpus_per_worker is not None and not use_gpu:
            raise ValueError("gpus_per_worker is set, but use_gpu is False. use_gpu must "
                             "be True if gpus_per_worker is set.")
        if use_gpu and gpus_per_worker is not None and gpus_per_worker < 1:
            raise ValueError(f"gpus_per_worker must be >= 1: Got {gpus_per_worker}.")
        if min_workers is None and num_workers is None and num_hosts is None:
            raise ValueError("give num_workers, num_hosts (with num_workers_per_host), or "
                             "min_workers for an elastic job")
        self.settings = settings
        self.num_workers, self.num_hosts = num_workers, num_hosts
        self.num_workers_per_host = num_workers_per_host
        self.cpus_per_worker, self.use_gpu = cpus_per_worker, use_gpu
        self.gpus_per_worker = gpus_per_worker or int(use_gpu)
        self.use_current_placement_group = use_current_placement_group
        self.elastic: ElasticJob | None = None
        if min_workers is not None:
            settings.elastic = True
            self.elastic = ElasticJob(settings.timeout_s, min_workers, max_workers,
                                      cpus_per_worker, self.gpus_per_worker, use_gpu,
                                      reset_limit, elastic_timeout,
                                      discovery_of(settings, override_discovery))
        self._placement: placement.Placement | None = None
        self._actors: world.ActorWorld | None = None

    # -- starting and stopping ---------------------------------------------------------
    def start(self, executable_cls: type | None = None, executable_args: list | None = None,
              executable_kwargs: dict | None = None,
              extra_env_vars: dict | None = None) -> None:
        """Place the workers, form their world and create each one's executable
        (``executable_cls(*executable_args, **executable_kwargs)``)."""
        if self.elastic is not None:
            self.elastic.env_vars = dict(extra_env_vars or {})
            return
        self._placement = placement.plan(
            self.num_workers, self.num_hosts, self.num_workers_per_host,
            self.cpus_per_worker, self.gpus_per_worker, self.use_gpu,
            self.use_current_placement_group, self.settings.placement_group_timeout_s)
        try:
            self._actors = world.start(self._placement.options, self.settings.timeout_s,
                                       self.use_gpu, extra_env_vars)
            self._get([w.start_executable.remote(executable_cls, executable_args,
                                                 executable_kwargs)
                       for w in self._actors.workers])
        except BaseException:
            self.shutdown()
            raise

    def shutdown(self) -> None:
        """End the workers (their world with them) and free the placement group."""
        if self._actors is not None:
            self._actors.kill()
            self._actors = None
        if self._placement is not None:
            self._placement.remove()
            self._placement = None

    # -- running -------------------------------------------------------------------------
    def execute(self, fn: Callable[[Any], Any], callbacks: list | None = None) -> list:
        """``fn(executable)`` on every worker; the values in rank order."""
        if self.elastic is not None:
            return self.elastic.run(lambda: fn(None))
        return self._get([w.execute.remote(fn) for w in self._workers()])

    def run(self, fn: Callable[..., Any], args: list | None = None, kwargs: dict | None = None,
            callbacks: list | None = None) -> list:
        """``fn(*args, **kwargs)`` on every worker; the values in rank order."""
        args, kwargs = list(args or []), dict(kwargs or {})
        if self.elastic is not None:
            return self.elastic.run(lambda: fn(*args, **kwargs))
        return self.execute(lambda _: fn(*args, **kwargs))

    def run_remote(self, fn: Callable[..., Any], args: list | None = None,
                   kwargs: dict | None = None) -> list:
        """As ``run``, but the ObjectRefs (rank order) at once, for ``ray.get``."""
        if self.elastic is not None:
            raise NotImplementedError("ObjectRefs cannot be returned from elastic runs: "
                                      "their workers are ephemeral")
        args, kwargs = list(args or []), dict(kwargs or {})
        return [w.execute.remote(lambda _: fn(*args, **kwargs)) for w in self._workers()]

    def execute_single(self, fn: Callable[[Any], Any]) -> Any:
        """``fn(executable)`` on rank 0 alone; its value."""
        if self.elastic is not None:
            raise NotImplementedError("elastic jobs do not support execute_single: use "
                                      "execute")
        import ray
        return ray.get(self._workers()[0].execute.remote(fn))

    def _workers(self) -> list:
        if self._actors is None:
            raise RuntimeError("RayExecutor: call start() first")
        return self._actors.workers

    def _get(self, refs: list) -> list:
        """ray.get, with a worker's death named (its PMI server ended the others too)."""
        import ray
        try:
            return ray.get(refs)
        except ray.exceptions.RayActorError as exc:
            raise RuntimeError(f"a horovodish worker died: {exc}") from exc

"""Elastic jobs on Ray: ``RayExecutor(min_workers=..., max_workers=...)`` and Horovod's
older ``ElasticRayExecutor``.

MPI cannot change the size of a running world, so an elastic job runs in generations:
each is a fresh set of actors (one per slot that Ray has, from ``min_workers`` up to
``max_workers``) forming a world of its own, running the function, which must use
``hvd.elastic.run`` and commit its state. Every commit is written on every node
(``HOROVODISH_ELASTIC_DIR``, as under horovodishrun), so when an actor or a node is
lost the next generation, on the actors that are left, goes on from the last commit.
When Ray has room for more workers, rank 0 hears so at its next commit (the notice
board of horovodishrun's elastic launcher, in this driver), every rank leaves at that
commit, and the next generation starts with the new slots.
"""
from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable

from ..common.elastic_store import ENV_DIR
from ..common.runtime.launcher_link import ENV_DRIVER, ENV_GENERATION, ENV_TOKEN
from ..common.world.rendezvous import addresses_toward
from . import world
from .settings import Settings
from .worker import RESTART

FAILURE_GRACE_S = 10.0   # after one rank fails: how long the others get to report


def discovery_of(settings: Settings, override_discovery: bool) -> Callable | None:
    """The job's host discovery: Ray's nodes (None), or, with ``override_discovery=False``,
    the settings' discovery object (Horovod's ``find_available_hosts_and_slots``)."""
    if override_discovery or settings.discovery is None:
        return None
    return lambda: dict(settings.discovery.find_available_hosts_and_slots())


def available_slots(cpus_per_worker: float, gpus_per_worker: int, use_gpu: bool
                    ) -> dict[str, int]:
    """Workers each alive node can hold, by node IP, in Ray's order (Horovod's
    RayHostDiscovery: CPUs, and GPUs when asked, per worker)."""
    import ray
    slots = {}
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        resources = node.get("Resources", {})
        count = int(resources.get("CPU", 0) // cpus_per_worker)
        if use_gpu:
            count = min(count, int(resources.get("GPU", 0) // max(1, gpus_per_worker)))
        if count > 0:
            slots[node["NodeManagerAddress"]] = count
    return slots


@dataclass
class _Outcome:
    results: list | None = None      # every rank returned
    restart: bool = False            # every rank left at a commit for more hosts
    lost: bool = False               # an actor died (its node, or the process)
    error: BaseException | None = None


class ElasticJob:
    """Generations of actors until one finishes (see the module docstring)."""

    def __init__(self, timeout_s: float, min_workers: int, max_workers: int | None,
                 cpus_per_worker: float, gpus_per_worker: int, use_gpu: bool,
                 reset_limit: int | None, elastic_timeout: float,
                 discovery: Callable[[], dict[str, int]] | None = None) -> None:
        self.timeout_s, self.min_workers = timeout_s, min_workers
        self.max_workers = max_workers
        self.cpus_per_worker, self.gpus_per_worker = cpus_per_worker, gpus_per_worker
        self.use_gpu, self.reset_limit = use_gpu, reset_limit
        self.elastic_timeout = elastic_timeout
        self.discovery = discovery or (lambda: available_slots(
            cpus_per_worker, gpus_per_worker, use_gpu))
        self.env_vars: dict[str, Any] = {}
        self.generations: list[int] = []   # the size of each generation started
        self._size = 0

    def run(self, fn: Callable[[], Any]) -> list:
        from horovodish.launcher.driver import Driver
        board = Driver(self._room_to_grow)
        commits = f"{tempfile.gettempdir()}/horovodish-ray-elastic-{board.token[:12]}"
        resets, generation = 0, 0
        try:
            while True:
                generation += 1
                options = self._options(self._wait_for_slots())
                self._size = len(options)
                self.generations.append(self._size)

                def env_for(rank: int, host: str, generation: int = generation) -> dict:
                    return {ENV_DIR: commits, ENV_TOKEN: board.token,
                            ENV_GENERATION: generation,
                            ENV_DRIVER: f"{addresses_toward(host)[0]}:{board.port}"}
                outcome = self._generation(options, env_for, fn)
                if outcome.results is not None:
                    return outcome.results
                if outcome.error is not None and not outcome.lost:
                    raise outcome.error
                if not outcome.restart:
                    resets += 1
                    if self.reset_limit is not None and resets > self.reset_limit:
                        raise RuntimeError(
                            "horovodish was shut down because the number of resets during "
                            f"the elastic job exceeded its limit: {self.reset_limit}")
        finally:
            board.close()
            _remove_everywhere(commits)

    def _generation(self, options: list[dict], env_for: Callable, fn: Callable) -> _Outcome:
        import ray
        try:
            actors = world.start(options, self.timeout_s, self.use_gpu, self.env_vars,
                                 launcher="Ray (elastic)", env_for=env_for)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as exc:
            return _Outcome(lost=True, error=exc)
        refs = [worker.run_elastic.remote(fn) for worker in actors.workers]
        outcome = _Outcome()
        values: dict[int, Any] = {}
        pending, deadline = list(refs), None
        while pending:
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            done, pending = ray.wait(pending, num_returns=1, timeout=timeout)
            if not done:
                break  # the failure's grace is over
            ref = done[0]
            try:
                values[refs.index(ref)] = ray.get(ref)
            except ray.exceptions.RayActorError as exc:
                outcome.lost, outcome.error = True, outcome.error or exc
            except ray.exceptions.RayTaskError as exc:
                outcome.error = outcome.error or exc.as_instanceof_cause()
            if outcome.error is not None and deadline is None:
                deadline = time.monotonic() + FAILURE_GRACE_S
        actors.kill()
        if outcome.error is None and len(values) == len(refs):
            if all(value == RESTART for value in values.values()):
                outcome.restart = True
            else:
                outcome.results = [values[rank] for rank in range(len(refs))]
        return outcome

    def _wait_for_slots(self) -> dict[str, int]:
        deadline = time.monotonic() + self.elastic_timeout
        while True:
            slots = self.discovery()
            if sum(slots.values()) >= self.min_workers:
                return slots
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"elastic job: Ray has {sum(slots.values())} worker slots "
                    f"({self.cpus_per_worker} CPUs each), fewer than min_workers="
                    f"{self.min_workers}, after {self.elastic_timeout:g} s")
            time.sleep(1.0)

    def _options(self, slots: dict[str, int]) -> list[dict]:
        """One actor option set per worker, node by node, at most max_workers."""
        options = []
        for ip, count in slots.items():
            for _ in range(count):
                if self.max_workers is not None and len(options) >= self.max_workers:
                    return options
                options.append({"num_cpus": self.cpus_per_worker,
                                "num_gpus": self.gpus_per_worker if self.use_gpu else 0,
                                "resources": {f"node:{ip}": 0.01}})
        return options

    def _room_to_grow(self) -> bool:
        """Rank 0's question at a commit: would the next generation be larger?"""
        if self.max_workers is not None and self._size >= self.max_workers:
            return False
        return sum(self.discovery().values()) > self._size


def _remove_everywhere(path: str) -> None:
    """The job's commit directory, on every node (a task pinned to each)."""
    import ray
    shutil.rmtree(path, ignore_errors=True)
    remover = ray.remote(num_cpus=0)(shutil.rmtree)
    refs = [remover.options(resources={f"node:{node['NodeManagerAddress']}": 0.001}).remote(
        path, True) for node in ray.nodes() if node.get("Alive")]
    try:
        ray.get(refs, timeout=30)
    except Exception:  # noqa: BLE001 - a node gone meanwhile keeps its copy
        pass


class ElasticRayExecutor:
    """Horovod's older elastic executor: ``create_settings`` with ``min_num_proc`` /
    ``max_num_proc``, workers by "slot"; ``run(worker_fn)`` with a function of no
    arguments. The same generations as ``RayExecutor(min_workers=...)``."""

    @staticmethod
    def create_settings(min_num_proc: int = 1, max_num_proc: int | None = None,
                        reset_limit: int | None = None, elastic_timeout: int = 600,
                        timeout_s: int = 30, ssh_identity_file: str | None = None,
                        nics: str | None = None, min_np: int | None = None,
                        max_np: int | None = None, **kwargs: Any) -> Settings:
        return Settings(nics=nics, ssh_identity_file=ssh_identity_file, timeout_s=timeout_s,
                        elastic=True, extra=dict(kwargs),
                        min_num_proc=min_np if min_np is not None else min_num_proc,
                        max_num_proc=max_np if max_np is not None else max_num_proc,
                        reset_limit=reset_limit, elastic_timeout=elastic_timeout)

    def __init__(self, settings: Settings, use_gpu: bool = False, cpus_per_slot: float = 1,
                 gpus_per_slot: int | None = None, env_vars: dict | None = None,
                 override_discovery: bool = True) -> None:
        if gpus_per_slot is not None and not use_gpu:
            raise ValueError("gpus_per_slot is set, but use_gpu is False. use_gpu must be "
                             "True if gpus_per_slot is set.")
        if use_gpu and gpus_per_slot is not None and gpus_per_slot < 1:
            raise ValueError(f"gpus_per_slot must be >= 1: Got {gpus_per_slot}.")
        self.job = ElasticJob(settings.timeout_s, settings.min_num_proc,
                              settings.max_num_proc, cpus_per_slot,
                              gpus_per_slot or int(use_gpu), use_gpu, settings.reset_limit,
                              settings.elastic_timeout,
                              discovery_of(settings, override_discovery))
        self.job.env_vars = dict(env_vars or {})

    def start(self) -> None:
        """Nothing to start ahead: each generation starts its own workers."""

    def run(self, worker_fn: Callable[[], Any], callbacks: list | None = None) -> list:
        """``worker_fn()`` on every worker of the last generation; values in rank order."""
        return self.job.run(worker_fn)

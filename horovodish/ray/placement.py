"""Where a Ray job's workers go: Horovod's two strategies over a placement group.

* ``num_workers`` (or a placement group the caller runs in): one bundle per worker,
  packed onto as few nodes as fit ("PACK");
* ``num_hosts`` x ``num_workers_per_host``: one bundle per host holding its workers,
  each on a node of its own ("STRICT_SPREAD").

Ranks are numbered node by node in both (MPI's layout, and the hierarchical allreduce,
want each host's ranks together).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Placement:
    """A placement group (created here or the caller's) and each worker's options."""

    group: Any
    options: list[dict[str, Any]] = field(default_factory=list)
    created: bool = False

    def remove(self) -> None:
        if self.created and self.group is not None:
            from ray.util.placement_group import remove_placement_group
            remove_placement_group(self.group)
            self.created = False


def create_group(bundles: list[dict[str, float]], strategy: str, timeout_s: float) -> Any:
    """A placement group of ``bundles``, ready; TimeoutError when the cluster cannot
    hold it within ``timeout_s``."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    group = placement_group(bundles, strategy=strategy)
    ready, _ = ray.wait([group.ready()], timeout=timeout_s)
    if not ready:
        remove_placement_group(group)
        raise TimeoutError(
            "Placement group creation timed out. Make sure your cluster either has "
            "enough resources or use an autoscaling cluster. Current resources "
            f"available: {ray.available_resources()}, resources requested by the "
            f"placement group: {bundles}")
    return group


def plan(num_workers: int | None, num_hosts: int | None, num_workers_per_host: int,
         cpus_per_worker: float, gpus_per_worker: int, use_gpu: bool,
         use_current_placement_group: bool, timeout_s: float) -> Placement:
    """The placement for a static job (see the module docstring)."""
    from ray.util import get_current_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    gpus = gpus_per_worker if use_gpu else 0
    current = get_current_placement_group() if use_current_placement_group else None
    if num_workers is not None or current is not None:
        count = num_workers or num_workers_per_host * (num_hosts or 1)
        group = current or create_group([{"CPU": cpus_per_worker, "GPU": gpus}] * count,
                                        "PACK", timeout_s)
        index = (lambda i: -1) if current is not None else (lambda i: i)
        bundles = [index(i) for i in range(count)]
    else:
        count = num_hosts * num_workers_per_host
        group = create_group([{"CPU": cpus_per_worker * num_workers_per_host,
                               "GPU": gpus * num_workers_per_host}] * num_hosts,
                             "STRICT_SPREAD", timeout_s)
        bundles = [i // num_workers_per_host for i in range(count)]
    options = [{"num_cpus": cpus_per_worker, "num_gpus": gpus,
                "scheduling_strategy": PlacementGroupSchedulingStrategy(
                    group, placement_group_bundle_index=bundle,
                    placement_group_capture_child_tasks=False)} for bundle in bundles]
    return Placement(group, options, created=current is None)

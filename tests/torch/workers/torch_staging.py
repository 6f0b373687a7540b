"""Host staging for the torch workers: with STAGE_THROUGH_HOST set, every tensor takes the
path that CUDA tensors take, and a last check says that it did.

Example (a worker written with tests/worker_support.py)::

    from torch_staging import staging_checks

    if __name__ == "__main__":
        checks = [allreduce, allgather, *staging_checks()]
        hvd.init()
        run_checks(checks, hvd.rank(), hvd.size())
"""
from __future__ import annotations

import os
from typing import Callable

from worker_support import check  # noqa: E402


def stage_every_tensor() -> list[int]:
    """Send every tensor through the host-staging path that CUDA tensors take (copy to
    host, collective, result copied back or moved to the tensor's device): a CPU-only
    machine cannot make a CUDA tensor, but the copies and write-backs are the same code.
    Returns a counter of staged tensors, to check that the path really ran."""
    import importlib
    import pkgutil

    from horovodish.torch import async_ops, tensor_views
    staged = [0]

    def always(tensor) -> bool:
        staged[0] += 1
        return True
    tensor_views.staged = always
    for info in pkgutil.iter_modules(async_ops.__path__):  # the CPU-only short paths
        module = importlib.import_module(f"{async_ops.__name__}.{info.name}")
        if hasattr(module, "plain_array"):
            module.plain_array = lambda tensor: None
    return staged


def staging_checks() -> list[Callable[[int, int], None]]:
    """With STAGE_THROUGH_HOST set: stage every tensor from now on, and return the check
    ``staged_through_host`` (run it last) that the path really ran; else no check."""
    if not os.environ.get("STAGE_THROUGH_HOST"):
        return []
    staged = stage_every_tensor()

    def staged_through_host(rank: int, size: int) -> None:
        check(staged[0] > 0, "the staging path never ran")
    return [staged_through_host]

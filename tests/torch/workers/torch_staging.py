"""What every torch worker shares: a failed check names the rank, and a failure ends the
process at once with a non-zero code (no MPI finalize that could wait for peers)."""
from __future__ import annotations

import os
import sys
import traceback
from typing import Callable

import horovodish.torch as hvd


def check(cond: bool, what: str) -> None:
    if not cond:
        raise AssertionError(f"rank {hvd.rank()}: {what}")


def stage_every_tensor() -> list[int]:
    """Send every tensor through the host-staging path that CUDA tensors take (copy to
    host, collective, result copied back or moved to the tensor's device): a CPU-only
    machine cannot make a CUDA tensor, but the copies and write-backs are the same code.
    Returns a counter of staged tensors, to check that the path really ran."""
    from horovodish.torch import async_ops, tensor_views
    staged = [0]

    def always(tensor) -> bool:
        staged[0] += 1
        return True
    tensor_views.staged = always
    async_ops._plain_array = lambda tensor: None  # the CPU-only fast path
    return staged


def run(main: Callable[[], None]) -> None:
    """Run a worker's main; on any failure print the traceback and exit 1. With
    STAGE_THROUGH_HOST set, every tensor takes the host-staged path (see above), and
    the worker must have staged some."""
    staged = stage_every_tensor() if os.environ.get("STAGE_THROUGH_HOST") else None
    try:
        main()
        if staged is not None:
            check(staged[0] > 0, "the staging path never ran")
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)

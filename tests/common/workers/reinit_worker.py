"""init() and shutdown() alternating many times, with a process set each time: every
communicator the runtime creates must be freed (MPICH has 2048 per process)."""
from __future__ import annotations


import numpy as np
from mpi4py import MPI

from worker_support import check, close, run_checks  # noqa: E402

from horovodish.common import api  # noqa: E402
from horovodish.common.api import add_process_set, collectives, remove_process_set  # noqa: E402
from horovodish.common.messages import ReduceOp  # noqa: E402

CYCLES = 500  # ~8 communicators each before they were freed: exhausted by ~300


def init_and_shutdown_alternate(rank: int, size: int) -> None:
    for cycle in range(CYCLES):
        api.init(process_sets="dynamic")
        check((api.rank(), api.size()) == (rank, size), f"cycle {cycle}: rank and size")
        # Other members every other time (ids restart at 1; process_sets_worker checks
        # that unnamed ops still pair).
        pair = add_process_set([0] if cycle % 2 == 0 else [size - 1])
        tensors = [np.full(20000, float(rank + cycle), np.float32) for _ in range(2)]
        handles = collectives.grouped_allreduce_async(tensors, [None, None], ["a", "b"],
                                                      ReduceOp.SUM)
        if pair.included():
            collectives.allreduce_async(tensors[0].copy(), None,
                                        collectives.auto_name("allreduce", pair), ReduceOp.SUM,
                                        process_set=pair).wait()
        want = np.full(20000, float(sum(r + cycle for r in range(size))), np.float32)
        for name, handle in zip("ab", handles):
            close(handle.wait(), want, f"cycle {cycle}: {name}")
        remove_process_set(pair)
        api.shutdown()


if __name__ == "__main__":
    run_checks([init_and_shutdown_alternate], MPI.COMM_WORLD.Get_rank(),
               MPI.COMM_WORLD.Get_size())

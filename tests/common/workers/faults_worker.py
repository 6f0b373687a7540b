"""A short training-like loop on the core API in which one rank misbehaves on purpose.

Modes: kill (SIGKILL itself), raise (an exception), raise_before_init (rank 1 raises
before init() while the others wait in it), stall (never submits 'lonely_tensor'),
stall_in_set (world rank 2 never submits 'lonely_tensor' on the set [0, 2]), raise_before_add
(rank 1 raises while rank 0 registers a process set), internal (rank 0's runtime fails inside a cycle, after the negotiation that sent rank 1
into the data allreduce; rank 0's script then ends with the error) and internal_caught
(the same, but rank 0 catches the error and keeps running).
"""
from __future__ import annotations

import os
import signal
import sys
import time

import numpy as np
from mpi4py import MPI

from horovodish.common import api
from horovodish.common.api import collectives
from horovodish.common.messages import ReduceOp
from horovodish.common.api import add_process_set


def allreduce(value: float, name: str) -> np.ndarray:
    data = np.full(8, value, dtype=np.float32)
    return collectives.allreduce_async(data, data, name, ReduceOp.SUM).wait()


def main(mode: str) -> None:
    if mode == "raise_before_init" and MPI.COMM_WORLD.Get_rank() == 1:
        raise FileNotFoundError("deliberate failure before init on rank 1")
    api.init(process_sets="dynamic")
    rank, size = api.rank(), api.size()
    if mode == "raise_before_add":
        allreduce(1.0, "warm")
        if rank == 1:
            time.sleep(0.5)
            raise RuntimeError("deliberate failure on rank 1 before add_process_set")
        add_process_set([0])  # agreed through the runtime: fails, not a hang in MPI
        return
    if mode == "stall_in_set":
        evens = add_process_set([0, 2])
        if rank == 0:
            data = np.ones(8, dtype=np.float32)
            collectives.allreduce_async(data, data, "lonely_tensor", ReduceOp.SUM,
                                        process_set=evens).wait()
        elif rank == 2:
            time.sleep(120)  # never submits; the report must name world rank 2
        return
    if mode == "stall":
        if rank == 1:
            time.sleep(120)  # never submits; the job must still end
        else:
            allreduce(1.0, "lonely_tensor")
        return
    if mode.startswith("internal"):
        allreduce(1.0, "before")
        if rank == 0:
            runtime = api.state().runtime

            def failing_finish(steps):
                raise RuntimeError("injected runtime failure")
            runtime._finish_cycle = failing_finish
        try:
            allreduce(1.0, "after")
        except Exception as exc:
            sys.stdout.write(f"rank {rank} got: {exc}\n")
            if mode == "internal_caught":
                time.sleep(120)  # the job must still end, without this rank's help
            raise
        return
    for step in range(10_000):
        if step == 20 and rank == 1:
            if mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError("deliberate failure on rank 1")
        got = allreduce(float(rank), "grad")
        assert np.all(got == sum(range(size))), got
        time.sleep(0.005)


if __name__ == "__main__":
    main(sys.argv[1])

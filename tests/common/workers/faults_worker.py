"""A short training-like loop on the core API in which one rank misbehaves on purpose.

Modes: kill (SIGKILL itself), raise (an exception), stall (never submits 'lonely_tensor').
"""
from __future__ import annotations

import os
import signal
import sys
import time

import numpy as np

from horovodish.common import basics, collectives
from horovodish.common.messages import ReduceOp


def allreduce(value: float, name: str) -> np.ndarray:
    data = np.full(8, value, dtype=np.float32)
    return collectives.allreduce_async(data, data, name, ReduceOp.SUM).wait()


def main(mode: str) -> None:
    basics.init()
    rank, size = basics.rank(), basics.size()
    if mode == "stall":
        if rank == 1:
            time.sleep(120)  # never submits; the job must still end
        else:
            allreduce(1.0, "lonely_tensor")
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

"""A training-like loop across hosts in which a fault strikes.

    python faults_worker.py kill READY     # rank 2 (on the second host) SIGKILLs itself
    python faults_worker.py link READY     # the test pulls the second host's link

Rank 0 creates the file READY once every rank has run 10 steps (the test waits for it
before pulling the link); every step's allreduce is checked against numpy.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import numpy as np

from horovodish.common import api
from horovodish.common.api import collectives
from horovodish.common.messages import ReduceOp


def main(mode: str, ready: Path) -> None:
    api.init()
    rank, size = api.rank(), api.size()
    for step in range(100_000):
        if step == 10 and rank == 0:
            ready.touch()
        if mode == "kill" and step == 20 and rank == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        data = np.full(300_000, rank + step, dtype=np.float32)  # hierarchical on 2x2
        got = collectives.allreduce_async(data, data, "grad", ReduceOp.SUM).wait()
        want = sum(range(size)) + size * step
        if not np.all(got == want):
            sys.stdout.write(f"rank {rank} step {step}: got {got[:4]}, want {want}\n")
            sys.exit(3)
        time.sleep(0.01)


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))

"""A job a scheduler started (srun, salloc + horovodishrun, sbatch): where each rank runs
against the layout it was asked for, and the collectives against numpy.

    python scheduled_worker.py LAYOUT [SECONDS]   # LAYOUT: h1:2,h2:2; SECONDS: then keep
                                                  # allreducing that long (a long job)
"""
from __future__ import annotations

import sys
import time

import numpy as np

from core_worker import check_other_collectives, check_topology
from horovodish.common import api
from horovodish.common.api import collectives
from horovodish.common.messages import ReduceOp

from worker_support import close, run_checks


def check_allreduce(rank: int, size: int) -> None:
    for count in (7, 300_000):
        data = np.arange(count, dtype=np.float64) * (rank + 1)
        got = collectives.allreduce_async(data, np.empty_like(data), f"ar.{count}",
                                          ReduceOp.SUM).wait()
        close(got, np.arange(count, dtype=np.float64) * sum(range(1, size + 1)),
              f"sum of {count}")


def keep_going(seconds: float) -> None:
    """Allreduce until seconds have passed; a line when going, for a test to act on."""
    sys.stdout.write(f"rank {api.rank()}: running\n")
    sys.stdout.flush()
    deadline = time.monotonic() + seconds
    data = np.ones(100_000, np.float32)
    while time.monotonic() < deadline:
        collectives.allreduce_async(data, np.empty_like(data), "long", ReduceOp.SUM).wait()
        time.sleep(0.01)


def main() -> None:
    api.init()
    run_checks([check_topology, check_allreduce, check_other_collectives],
               api.rank(), api.size())
    if len(sys.argv) > 2:
        keep_going(float(sys.argv[2]))
    api.shutdown()


if __name__ == "__main__":
    main()

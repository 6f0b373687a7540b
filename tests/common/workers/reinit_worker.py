"""init() and shutdown() alternating many times, with a process set each time: every
communicator the runtime creates must be freed (MPICH has 2048 per process)."""
from __future__ import annotations

import sys

import numpy as np

from horovodish.common import api
from horovodish.common.api import collectives
from horovodish.common.messages import ReduceOp
from horovodish.common.api import add_process_set, remove_process_set

CYCLES = 500  # ~8 communicators each before they were freed: exhausted by ~300


def main() -> None:
    for cycle in range(CYCLES):
        api.init(process_sets="dynamic")
        rank, size = api.rank(), api.size()
        # Other members every other time (ids restart at 1): unnamed ops must still pair.
        pair = add_process_set(list(range(size)) if cycle % 2 == 0 else [size - 1])
        tensors = [np.full(20000, float(rank + cycle), np.float32) for _ in range(2)]
        handles = collectives.grouped_allreduce_async(tensors, [None, None], ["a", "b"],
                                                      ReduceOp.SUM)
        if pair.included():
            collectives.allreduce_async(tensors[0].copy(), None,
                                        collectives.auto_name("allreduce", pair), ReduceOp.SUM,
                                        process_set=pair).wait()
        want = sum(r + cycle for r in range(size))
        assert all(np.all(h.wait() == want) for h in handles), cycle
        remove_process_set(pair)
        api.shutdown()
    sys.stdout.write(f"OK rank {rank} of {size}: {CYCLES} cycles\n")


if __name__ == "__main__":
    main()

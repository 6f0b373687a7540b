"""init() on a rank whose peers have shut down and exited (Horovod's test classes call
init() for every test, and one rank may finish the suite first): it returns at once
instead of building a runtime that would wait for them for ever, and a collective then
raises HorovodInternalError naming the ranks that left. Rank 0 stays; the others leave.
"""
from __future__ import annotations

import sys
import time

import numpy as np

from horovodish.common import api
from horovodish.common.api import collectives, process_state
from horovodish.common.errors import HorovodInternalError
from horovodish.common.messages import ReduceOp


def main() -> None:
    api.init()
    rank, size = api.rank(), api.size()
    data = np.full(4, float(rank + 1), np.float32)
    total = collectives.allreduce_async(data, data, "before", ReduceOp.SUM).wait()
    assert float(total[0]) == size * (size + 1) / 2, total
    if rank != 0:
        api.shutdown()
        sys.exit(0)
    deadline = time.monotonic() + 20
    while not process_state.current().runtime.stopped and time.monotonic() < deadline:
        time.sleep(0.01)
    print(f"RUNTIME STOPPED {process_state.current().runtime.stopped}", flush=True)
    start = time.monotonic()
    api.init()
    print(f"INIT RETURNED after {time.monotonic() - start:.2f} s", flush=True)
    try:
        collectives.allreduce_async(data, data, "after", ReduceOp.SUM).wait()
        print("COLLECTIVE DID NOT RAISE", flush=True)
    except HorovodInternalError as exc:
        print(f"COLLECTIVE RAISED: {exc}", flush=True)
    api.shutdown()


if __name__ == "__main__":
    main()

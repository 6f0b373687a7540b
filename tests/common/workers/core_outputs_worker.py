"""Outputs given to the core API: checked at submit, and strided ones receive results."""
from __future__ import annotations

import sys

import numpy as np

from horovodish.common import api
from horovodish.common.api import collectives
from horovodish.common.messages import ReduceOp


def main() -> None:
    api.init()
    rank, size = api.rank(), api.size()
    value = np.full((500, 100), float(rank + 1), np.float32)
    want = float(sum(r + 1 for r in range(size)))
    for bad, what in [(np.empty((100, 500), np.float32), "shape (100, 500)"),
                      (np.empty((500, 100), np.float64), "dtype float64")]:
        try:
            collectives.allreduce_async(value, bad, "mismatch", ReduceOp.SUM)
            raise AssertionError("a mismatched output must raise at submit")
        except ValueError as exc:
            assert "'mismatch'" in str(exc) and what in str(exc), exc
    # A strided output, alone and fused with a runtime-owned result.
    alone = np.zeros((100, 500), np.float32).T
    got = collectives.allreduce_async(value, alone, "strided.alone", ReduceOp.SUM).wait()
    assert got is alone and np.all(alone == want), alone[:2, :2]
    strided = np.zeros((100, 500), np.float32).T
    handles = collectives.grouped_allreduce_async(
        [value.copy(), value], [None, strided], ["fused.owned", "fused.strided"], ReduceOp.SUM)
    owned, given = (h.wait() for h in handles)
    assert np.all(owned == want) and given is strided and np.all(strided == want), strided[:2]
    sys.stdout.write(f"OK rank {rank} of {size}\n")
    api.shutdown()


if __name__ == "__main__":
    main()

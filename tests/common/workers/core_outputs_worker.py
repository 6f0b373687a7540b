"""Outputs given to the core API: checked at submit, and strided ones receive results."""
from __future__ import annotations


import numpy as np

from worker_support import check, close, expect_error, run_checks  # noqa: E402

from horovodish.common import api  # noqa: E402
from horovodish.common.api import collectives  # noqa: E402
from horovodish.common.messages import ReduceOp  # noqa: E402


def value(rank: int) -> np.ndarray:
    return np.full((500, 100), float(rank + 1), np.float32)


def total(size: int) -> float:
    return float(sum(r + 1 for r in range(size)))


def mismatched_outputs_raise_at_submit(rank: int, size: int) -> None:
    for bad, what in [(np.empty((100, 500), np.float32), "shape (100, 500)"),
                      (np.empty((500, 100), np.float64), "dtype float64")]:
        expect_error(lambda: collectives.allreduce_async(value(rank), bad, "mismatch",
                                                         ReduceOp.SUM),
                     ValueError, "'mismatch'", what, what=f"an output of {what}")


def strided_output_alone(rank: int, size: int) -> None:
    alone = np.zeros((100, 500), np.float32).T
    got = collectives.allreduce_async(value(rank), alone, "strided.alone", ReduceOp.SUM).wait()
    check(got is alone, "the given output is returned")
    close(alone, np.full((500, 100), total(size), np.float32), "strided output")


def strided_output_fused_with_a_runtime_owned_one(rank: int, size: int) -> None:
    strided = np.zeros((100, 500), np.float32).T
    mine = value(rank)
    handles = collectives.grouped_allreduce_async(
        [mine.copy(), mine], [None, strided], ["fused.owned", "fused.strided"], ReduceOp.SUM)
    owned, given = (h.wait() for h in handles)
    want = np.full((500, 100), total(size), np.float32)
    close(owned, want, "runtime-owned result")
    check(given is strided, "the given output is returned")
    close(strided, want, "strided output")


def broadcast_from_every_root(rank: int, size: int) -> None:
    """In place, into a given output, and into a runtime-owned one, from every root, at
    sizes from empty to several MiB (MPI's large transfers and the root's overlapped
    copy), each followed by an allreduce: every rank gets the root's values, and an
    out-of-place root's input is left as it was."""
    for count in (0, 3, 16 << 10, (3 << 20) + 5):
        for root in range(size):
            want = np.arange(count, dtype=np.float32) + root * 7
            for form in ("in place", "given", "owned"):
                mine = want.copy() if rank == root else np.full(count, -1.0, np.float32)
                output = {"in place": mine, "given": np.full(count, -2.0, np.float32),
                          "owned": None}[form]
                name = f"bcast.{count}.{root}.{form}"
                got = collectives.broadcast_async(mine, output, root, name).wait()
                close(got, want, f"{name}: the result")
                if form != "in place":
                    close(mine, want if rank == root else np.full(count, -1.0, np.float32),
                          f"{name}: the input, out of place")
                ones = np.ones(1000, np.float32)
                close(collectives.allreduce_async(ones, ones, f"after.{name}",
                                                  ReduceOp.SUM).wait(),
                      np.full(1000, size, np.float32), f"the allreduce after {name}")


if __name__ == "__main__":
    api.init()
    run_checks([mismatched_outputs_raise_at_submit, strided_output_alone,
                strided_output_fused_with_a_runtime_owned_one, broadcast_from_every_root],
               api.rank(), api.size())
    api.shutdown()

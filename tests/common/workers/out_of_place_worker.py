"""Out-of-place allreduce on every backend: the result lands in the output (or a result
block) straight from the input, the input is untouched, and a result the caller still
holds is never overwritten by the next call. Checked against numpy on every rank."""
from __future__ import annotations


import numpy as np

from worker_support import check, close, run_checks  # noqa: E402

from horovodish.common import api  # noqa: E402
from horovodish.common.api import collectives  # noqa: E402
from horovodish.common.messages import ReduceOp  # noqa: E402

# Counts that do not divide by 2 or 3 ranks: the ring's segments are uneven.
COUNTS = [1, 1001, 40_003, 300_007]


def values(rank: int, count: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed * 10 + rank).integers(-50, 50, count).astype(np.float32)


def total(size: int, count: int, seed: int) -> np.ndarray:
    return sum(values(r, count, seed) for r in range(size))


def into_given_output(rank: int, size: int) -> None:
    for seed, count in enumerate(COUNTS):
        mine = values(rank, count, seed)
        kept = mine.copy()
        out = np.full(count, np.nan, np.float32)
        got = collectives.allreduce_async(mine, out, f"given.{count}", ReduceOp.SUM).wait()
        check(got is out, f"{count}: the given output is returned")
        close(out, total(size, count, seed), f"{count} values into the given output")
        close(mine, kept, f"{count} values: the input is untouched")


def into_runtime_blocks(rank: int, size: int) -> None:
    held = []
    for round_ in range(3):
        for seed, count in enumerate(COUNTS):
            mine = values(rank, count, seed + round_)
            kept = mine.copy()
            got = collectives.allreduce_async(mine, None, f"owned.{count}",
                                              ReduceOp.SUM).wait()
            close(got, total(size, count, seed + round_), f"round {round_}, {count} values")
            close(mine, kept, f"round {round_}, {count} values: the input is untouched")
            held.append((got, total(size, count, seed + round_)))
    for index, (got, want) in enumerate(held):  # later calls never reused a held block
        close(got, want, f"held result {index} after every later call")


def a_result_reduced_again(rank: int, size: int) -> None:
    """A result (a view of a runtime block) as the next call's input: the new result
    gets another block, and the input is left as it was."""
    for seed, count in enumerate(COUNTS):
        result = collectives.allreduce_async(values(rank, count, seed), None,
                                             f"chain.{count}", ReduceOp.SUM).wait()
        want = total(size, count, seed)
        for link in range(3):
            before = result.copy()
            again = collectives.allreduce_async(result, None, f"chain.{count}",
                                                ReduceOp.SUM).wait()
            check(not np.may_share_memory(again, result),
                  f"{count} values, link {link}: the result shares the input's memory")
            close(result, before, f"{count} values, link {link}: the input is untouched")
            want = want * size
            close(again, want, f"{count} values, link {link}")
            result = again


def with_scale_factors_and_average(rank: int, size: int) -> None:
    for seed, count in enumerate(COUNTS):
        mine = values(rank, count, seed)
        got = collectives.allreduce_async(mine, None, f"average.{count}", ReduceOp.AVERAGE,
                                          prescale=0.5, postscale=4.0).wait()
        close(got, total(size, count, seed) * 0.5 * 4.0 / size, f"{count} values averaged",
              tol=1e-5)


if __name__ == "__main__":
    api.init()
    run_checks([into_given_output, into_runtime_blocks, a_result_reduced_again,
                with_scale_factors_and_average],
               api.rank(), api.size())
    api.shutdown()

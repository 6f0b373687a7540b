"""init(comm=[0, 1]) on 3 ranks: the listed ranks get a world of two that works; the
rank left out gets a ValueError saying so (it got a raw MPI error on MPI_COMM_NULL)."""
from __future__ import annotations


import numpy as np
from mpi4py import MPI

from worker_support import check, close, expect_error, run_checks  # noqa: E402

from horovodish.common import api  # noqa: E402
from horovodish.common.api import collectives  # noqa: E402
from horovodish.common.messages import ReduceOp  # noqa: E402


def init_with_ranks_0_and_1(rank: int, size: int) -> None:
    """rank and size are the world's."""
    if rank == 2:
        expect_error(lambda: api.init(comm=[0, 1]), ValueError, "not in the list", "[0, 1]",
                     what="init() on a rank left out")
        check(not api.is_initialized(), "initialized although left out")
        return
    api.init(comm=[0, 1])
    check(api.size() == 2 and api.rank() == rank, f"rank {api.rank()} of {api.size()}")
    got = collectives.allreduce_async(np.full(3, rank + 1.0), None, "subset",
                                      ReduceOp.SUM).wait()
    close(got, np.full(3, 3.0), "allreduce in the world of two")
    api.shutdown()


if __name__ == "__main__":
    run_checks([init_with_ranks_0_and_1], MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size())

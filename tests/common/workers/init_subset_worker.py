"""init(comm=[0, 1]) on 3 ranks: the listed ranks get a world of two that works; the
rank left out gets a ValueError saying so (it got a raw MPI error on MPI_COMM_NULL)."""
from __future__ import annotations

import sys

import numpy as np
from mpi4py import MPI

from horovodish.common import api
from horovodish.common.api import collectives
from horovodish.common.messages import ReduceOp


def main() -> None:
    world_rank = MPI.COMM_WORLD.Get_rank()
    try:
        api.init(comm=[0, 1])
    except ValueError as exc:
        assert world_rank == 2 and "not in the list" in str(exc) and "[0, 1]" in str(exc), exc
        assert not api.is_initialized()
        sys.stdout.write(f"OK rank {world_rank}: {exc}\n")
        return
    assert world_rank in (0, 1) and api.size() == 2 and api.rank() == world_rank
    got = collectives.allreduce_async(np.full(3, world_rank + 1.0), None, "subset",
                                      ReduceOp.SUM).wait()
    assert np.array_equal(got, np.full(3, 3.0)), got
    api.shutdown()
    sys.stdout.write(f"OK rank {world_rank}\n")


if __name__ == "__main__":
    main()

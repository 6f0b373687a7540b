"""Negotiation on real ranks: request records through MPI's gather, and allgathers
whose first dimensions change every step without a slow-path cycle."""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

from worker_support import check, close, run_checks  # noqa: E402

from horovodish.common import api  # noqa: E402
from horovodish.common.api import collectives  # noqa: E402
from horovodish.common.api.process_sets import global_process_set  # noqa: E402
from horovodish.common.messages import ReduceOp, Request, RequestType  # noqa: E402
from horovodish.common.negotiation.mpi_transport import MPITransport  # noqa: E402
from horovodish.common.negotiation.request_records import encode  # noqa: E402


def _requests(rank: int, count: int) -> list[Request]:
    return [Request(f"t{i}", RequestType.ALLGATHER, "float32", (rank + i, 4))
            for i in range(count)]


def records_gathered_through_mpi(rank: int, size: int) -> None:
    """Records of rank-dependent lengths (every rank a different count), then longer
    ones (a bigger receive buffer), then shorter ones (the buffer reused): rank 0 reads
    each rank's list and first dimensions as that rank encoded them."""
    transport = MPITransport(MPI.COMM_WORLD.Dup())
    for scale in (1, 40, 2):
        mine = _requests(rank, scale * (rank + 1))
        gathered = transport.gather_records(encode(mine))
        if rank != 0:
            check(gathered is None, "only rank 0 receives the records")
            continue
        groups = gathered.groups()
        check([g.ranks.tolist() for g in groups] == [[r] for r in range(size)],
              f"groups {[g.ranks.tolist() for g in groups]}")
        for group in groups:
            (r,) = group.ranks.tolist()
            want = _requests(r, scale * (r + 1))
            check([q.name for q in group.requests] == [q.name for q in want],
                  f"rank {r}'s names at scale {scale}")
            close(group.varying[0], np.array([q.shape[0] for q in want]),
                  f"rank {r}'s first dimensions at scale {scale}")
    transport.comm.Free()


def _rows(step: int, rank: int) -> int:
    return int(np.random.default_rng(step * 101 + rank).integers(0, 6))


def changing_dims_and_splits_ride_the_cache(rank: int, size: int) -> None:
    """A loss allreduce, a batch allgather with new per-rank first dimensions and an
    alltoall with new splits every step: right results on every rank, and no slow-path cycle after the first step."""
    controller = global_process_set.runtime.controller
    for step in range(12):
        if step == 1:
            slow_before = controller.slow_cycles
        mine = np.full((_rows(step, rank), 3), rank * 10 + step, np.float32)
        gathered = collectives.allgather_async(
            mine, lambda shape: np.empty(shape, np.float32), "batch").wait()
        want = np.concatenate([np.full((_rows(step, r), 3), r * 10 + step, np.float32)
                               for r in range(size)])
        close(gathered, want, f"step {step}'s allgather")
        splits = [_rows(step, rank * size + dest) for dest in range(size)]
        sent = np.concatenate([np.full((n, 2), rank * 100 + dest + step, np.int32)
                               for dest, n in enumerate(splits)])
        got = collectives.alltoall_async(sent, splits, lambda shape: np.empty(shape, np.int32),
                                         "routed").wait()
        received = got[0] if isinstance(got, tuple) else got
        want = np.concatenate([np.full((_rows(step, src * size + rank), 2),
                                       src * 100 + rank + step, np.int32)
                               for src in range(size)])
        close(received, want, f"step {step}'s alltoall")
        loss = np.array([float(rank)], np.float32)
        close(collectives.allreduce_async(loss, loss, "loss", ReduceOp.SUM).wait(),
              np.array([sum(range(size))], np.float32), f"step {step}'s allreduce")
    slow = controller.slow_cycles - slow_before
    check(slow == 0, f"{slow} slow-path cycles after the first step")


if __name__ == "__main__":
    api.init()
    run_checks([records_gathered_through_mpi, changing_dims_and_splits_ride_the_cache],
               api.rank(), api.size())
    api.shutdown()

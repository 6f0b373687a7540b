"""What a rank pays to write shared memory that another core has just read.

    horovodishrun -np 2 python -m horovodish.bench.sharing [--bytes 1048576] [--repeats 100]

Every transfer within a host, MPI's own and the runtime's shared-memory paths, ends with
the reader's core holding copies of the lines it read, and the writer pays to take them
back when it next writes there. How much depends on where the two cores sit, which a VM
does not show: on a 2-core AMD EPYC machine, 3x a plain write when both vCPUs are on
one CCD (one L3), up to 20x when they are on two, and the host can move them while a job
runs. That is what made MPI's and our times move together by 2 to 4x between runs, and
why shared-memory slots are taken in turn (docs/tuning.md, section 5).

Rank 0 writes ``--bytes`` of a shared window (``MPI_Win_allocate_shared``), timed, in
three settings, each ``--repeats`` times: alone; just after rank 1 copied those bytes
out; and after rank 1 copied them out and then 2 MiB of its own memory (on one CCD that
drops the lines from its L2, across CCDs it does not). Printed: rank 0's median time
per write and each setting's ratio to writing alone. Other ranks only take part in the
barriers. Run it next to a benchmark to know which mode the benchmark ran in.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from mpi4py import MPI

EVICT_BYTES = 2 << 20  # an L2's size on the AMD EPYC above


def measure(comm: MPI.Comm, nbytes: int, repeats: int) -> dict[str, float]:
    """Setting -> rank 0's median seconds per write (empty on other ranks). Collective."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    window = MPI.Win.Allocate_shared(nbytes if node.Get_rank() == 0 else 0, 1, comm=node)
    try:
        memory, _ = window.Shared_query(0)
        shared = np.frombuffer(memory, dtype=np.uint8, count=nbytes)
        source = np.full(nbytes, 1, np.uint8)
        copy_out = np.empty(nbytes, np.uint8)
        other, other_out = np.full(EVICT_BYTES, 2, np.uint8), np.empty(EVICT_BYTES, np.uint8)
        rank = node.Get_rank()
        times: dict[str, float] = {}
        for setting, reads, evicts in (("alone", False, False),
                                       ("after rank 1 read it", True, False),
                                       ("after rank 1 read it, then 2 MiB", True, True)):
            samples = []
            for _ in range(repeats):
                if rank == 1 and reads:
                    np.copyto(copy_out, shared)
                    if evicts:
                        np.copyto(other_out, other)
                node.Barrier()
                if rank == 0:
                    start = time.perf_counter()
                    np.copyto(shared, source)
                    samples.append(time.perf_counter() - start)
                node.Barrier()
            if rank == 0:
                times[setting] = statistics.median(samples)
        return times
    finally:
        window.Free()
        node.Free()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", type=int, default=1 << 20, help="bytes per write")
    parser.add_argument("--repeats", type=int, default=100, help="writes per setting")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    alone = comm.allreduce(node.Get_size() < 2, op=MPI.LOR)  # every rank stops, or none
    node.Free()
    if alone:
        raise SystemExit("bench.sharing needs at least 2 ranks on each host")
    times = measure(comm, args.bytes, args.repeats)
    if comm.Get_rank() == 0:
        alone = times["alone"]
        print(f"bench.sharing: rank 0 writes {args.bytes} bytes of shared memory; us per "
              f"write (median of {args.repeats}) and the ratio to writing alone")
        for setting, seconds in times.items():
            print(f"  {setting:36s}{seconds * 1e6:9.1f}   ({seconds / alone:.1f}x alone)")


if __name__ == "__main__":
    main()

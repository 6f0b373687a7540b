"""What eager cycles save a synchronous small allreduce, in one job.

    horovodishrun -np 2 python -m horovodish.bench.eager [--sizes 4096,65536,...]
        [--rounds 5]

Torch's ``allreduce_`` (in place, float32 Sum) of each size, repeated, with eager
cycles on (the default limit, or HOROVODISH_EAGER_LIMIT) and off, in alternating rounds;
``MPI_Allreduce`` on a preallocated buffer in the same rounds is the baseline. Per size,
on rank 0: the median over rounds of each one's time per call (the slowest rank's), and
MPI's time ÷ each (above 1: faster than MPI). Sizes above the limit run the same path
both ways (shown as such). docs/tuning.md reads the table.
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
from typing import Iterator

import numpy as np
from mpi4py import MPI

from ..common.api import process_state
from .timing import alternating

DEFAULT_SIZES = (4096, 16384, 65536, 131072, 262144, 1 << 20, 4 << 20)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m horovodish.bench.eager",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)),
                        help="comma-separated sizes in bytes")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds")
    args = parser.parse_args(argv)
    import torch

    import horovodish.torch as hvd
    hvd.init()
    comm = MPI.COMM_WORLD.Dup()
    runtime = process_state.state().runtime
    if runtime.eager is None:
        raise SystemExit("eager cycles are off in this job (HOROVODISH_EAGER_LIMIT=0, "
                         "CPU_OPERATIONS or HIERARCHICAL_ALLREDUCE set, or one rank)")
    limit, split_limit = runtime.eager.limit, runtime.eager.split_limit

    @contextlib.contextmanager
    def eager(on: bool) -> Iterator[None]:
        comm.Barrier()  # nothing in flight on any rank: switching is safe now
        runtime.set_eager_limit(limit if on else 0, split_limit if on else 0)
        yield

    rows = []
    for size in (int(s) for s in args.sizes.split(",")):
        tensor = torch.zeros(size // 4)
        send = np.zeros(size // 4, np.float32)
        receive = np.empty_like(send)
        name = f"bench.eager.{size}"

        def ours() -> None:
            hvd.allreduce_(tensor, op=hvd.Sum, name=name)
        times = alternating(
            {"eager": ours, "plain": ours, "mpi": lambda: comm.Allreduce(send, receive)},
            comm, rounds=args.rounds,
            around={"eager": lambda: eager(True), "plain": lambda: eager(False)})
        rows.append((size, {k: statistics.median(v) for k, v in times.items()},
                     size * (comm.Get_size() - 1) <= limit or size <= split_limit))
    with eager(True):
        pass
    if comm.Get_rank() == 0:
        print(f"bench.eager: {comm.Get_size()} ranks, torch allreduce_ float32 Sum, us per "
              f"call (median of {args.rounds} rounds); eager limit {limit} bytes, by "
              f"slices up to {split_limit}")
        print(f"{'bytes':>9} {'MPI':>8} {'eager':>8} {'plain':>8} {'MPI/eager':>10} "
              f"{'MPI/plain':>10}")
        for size, median, rides in rows:
            mpi, on, off = median["mpi"], median["eager"], median["plain"]
            note = "" if rides else "  (above the limit: the same path)"
            print(f"{size:>9} {mpi * 1e6:8.1f} {on * 1e6:8.1f} {off * 1e6:8.1f} "
                  f"{mpi / on:9.2f}x {mpi / off:9.2f}x{note}")
    comm.Free()
    hvd.shutdown()


if __name__ == "__main__":
    main()

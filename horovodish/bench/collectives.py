"""The collectives users call through torch, in place and out of place, and through
TensorFlow, each next to MPI's own call on numpy buffers in the same run: broadcast,
grouped allreduce, allgather, reducescatter and alltoall (every public path, not only
allreduce; the sweep, ``main``, adds torch's allreduce itself), every buffer written
before it is timed. The first call at each size is timed apart (fresh tensors, a fresh
name, and for MPI fresh buffers): what a job pays once per size, page faults and setup
included; beside it MPI's out-of-place call that allocates its output in the call, the
first-call baseline for the out-of-place paths. Each of those first calls comes right
after the rank wrote and freed memory of the output's size (``_recycle``).

    horovodishrun -np 2 python -m horovodish.bench.collectives [--max-bytes N] [--record docs/records]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Callable

import numpy as np
from mpi4py import MPI

from .timing import Contender, alternating

SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20]
SWEEP_SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20, 1 << 30, 2 << 30]
GROUP = 8  # tensors of a grouped allreduce (the size is the group's)

def _written(count: int, dtype: type = np.float32) -> np.ndarray:
    """Zeros written into every page, as torch.zeros writes them and as a user's tensor
    holds data. (np.zeros of a large size maps the kernel's zero page until written:
    MPI sending from it reads one cached page over and over, and a 256 MiB broadcast or
    allgather from such a buffer took 0.55-0.65x the time it takes from written memory,
    2 ranks, 2-core x86 VM.)"""
    return np.full(count, 0, dtype)


# op -> (its MPI baseline, [(path, factory of one synchronous call)]); a path's name
# ending in "_" is in place.
Factory = Callable[[int, str], Contender]


def _tensorflow_paths() -> dict[str, tuple[str, Factory]]:
    """op -> (path, factory): TensorFlow's out-of-place calls (it has no in-place ones)."""
    import tensorflow as tf

    from .. import tensorflow as hvd

    def broadcast(nbytes: int, name: str) -> Contender:
        tensor = tf.zeros([nbytes // 4])
        return lambda: hvd.broadcast(tensor, 0, name=name)

    def grouped(nbytes: int, name: str) -> Contender:
        tensors = [tf.zeros([max(1, nbytes // 4 // GROUP)]) for _ in range(GROUP)]
        return lambda: hvd.grouped_allreduce(tensors, name=name, op=hvd.Sum)

    def allgather(nbytes: int, name: str) -> Contender:
        tensor = tf.zeros([nbytes // 4])
        return lambda: hvd.allgather(tensor, name=name)

    def reducescatter(nbytes: int, name: str) -> Contender:
        tensor = tf.zeros([nbytes // 4 // hvd.size() * hvd.size()])
        return lambda: hvd.reducescatter(tensor, name=name, op=hvd.Sum)
    def alltoall(nbytes: int, name: str) -> Contender:
        tensor = tf.zeros([nbytes // 4 // hvd.size() * hvd.size()])
        return lambda: hvd.alltoall(tensor, name=name)
    return {"broadcast": ("tf broadcast", broadcast),
            "alltoall": ("tf alltoall", alltoall),
            f"grouped allreduce of {GROUP}": ("tf grouped_allreduce", grouped),
            "allgather": ("tf allgather", allgather),
            "reducescatter": ("tf reducescatter", reducescatter)}


def _ops(comm: MPI.Comm, tensorflow: bool, with_allreduce: bool = False
         ) -> dict[str, tuple[Factory, list[tuple[str, Factory]]]]:
    import torch

    from .. import torch as hvd
    size = comm.Get_size()

    mpi = _mpi_calls(comm, fresh_output=False)

    def broadcast(in_place: bool) -> Factory:
        def make(nbytes: int, name: str) -> Contender:
            tensor = torch.zeros(nbytes // 4)
            call = hvd.broadcast_ if in_place else hvd.broadcast
            return lambda: call(tensor, 0, name=name)
        return make

    def allreduce(in_place: bool) -> Factory:
        def make(nbytes: int, name: str) -> Contender:
            tensor = torch.zeros(nbytes // 4)
            call = hvd.allreduce_ if in_place else hvd.allreduce
            return lambda: call(tensor, name=name, op=hvd.Sum)
        return make

    def grouped(in_place: bool) -> Factory:
        def make(nbytes: int, name: str) -> Contender:
            tensors = [torch.zeros(max(1, nbytes // 4 // GROUP)) for _ in range(GROUP)]
            call = hvd.grouped_allreduce_ if in_place else hvd.grouped_allreduce
            return lambda: call(tensors, name=name, op=hvd.Sum)
        return make

    def allgather(nbytes: int, name: str) -> Contender:
        tensor = torch.zeros(nbytes // 4)
        return lambda: hvd.allgather(tensor, name=name)

    def reducescatter(nbytes: int, name: str) -> Contender:
        tensor = torch.zeros(nbytes // 4 // size * size)
        return lambda: hvd.reducescatter(tensor, name=name, op=hvd.Sum)
    def alltoall(nbytes: int, name: str) -> Contender:
        tensor = torch.zeros(nbytes // 4 // size * size)
        return lambda: hvd.alltoall(tensor, name=name)
    ops = {"allreduce": (mpi["allreduce"], [("allreduce_", allreduce(True)),
                                            ("allreduce", allreduce(False))])} \
        if with_allreduce else {}
    ops |= {
        "broadcast": (mpi["broadcast"], [("broadcast_", broadcast(True)),
                                         ("broadcast", broadcast(False))]),
        f"grouped allreduce of {GROUP}": (mpi["allreduce"], [
            ("grouped_allreduce_", grouped(True)), ("grouped_allreduce", grouped(False))]),
        "allgather": (mpi["allgather"], [("allgather", allgather)]),
        "reducescatter": (mpi["reducescatter"], [("reducescatter", reducescatter)]),
        "alltoall": (mpi["alltoall"], [("alltoall", alltoall)]),
    }
    if tensorflow:
        for op, path in _tensorflow_paths().items():
            ops[op][1].append(path)
    return ops


def _mpi_calls(comm: MPI.Comm, fresh_output: bool) -> dict[str, Factory]:
    """op -> MPI's own call on written numpy buffers. Not fresh_output: the baseline,
    into preallocated buffers (allreduce and broadcast in place). fresh_output: the
    out-of-place form that allocates its output as it goes (np.empty), as a user of
    mpi4py at a new size would: the first-call baseline of the out-of-place paths,
    which pay for fresh memory too (see _recycle)."""
    size, rank = comm.Get_size(), comm.Get_rank()

    def output(count: int) -> Callable[[], np.ndarray]:
        if fresh_output:
            return lambda: np.empty(count, np.float32)
        buf = _written(count)
        return lambda: buf

    def allreduce(nbytes: int, name: str) -> Contender:
        send = _written(nbytes // 4)
        if not fresh_output:
            return lambda: comm.Allreduce(MPI.IN_PLACE, send, op=MPI.SUM)
        return lambda: comm.Allreduce(send, np.empty_like(send), op=MPI.SUM)

    def bcast(nbytes: int, name: str) -> Contender:
        send = _written(nbytes // 4)
        if not fresh_output or rank == 0:
            return lambda: comm.Bcast(send, root=0)
        return lambda: comm.Bcast(np.empty_like(send), root=0)

    def allgather(nbytes: int, name: str) -> Contender:
        send = _written(nbytes // 4)
        recv = output(size * send.size)
        return lambda: comm.Allgather(send, recv())

    def reducescatter(nbytes: int, name: str) -> Contender:
        send = _written(nbytes // 4 // size * size)
        recv = output(send.size // size)
        return lambda: comm.Reduce_scatter_block(send, recv(), op=MPI.SUM)

    def alltoall(nbytes: int, name: str) -> Contender:
        send = _written(nbytes // 4 // size * size)
        recv = output(send.size)
        return lambda: comm.Alltoall(send, recv())
    return {"allreduce": allreduce, "broadcast": bcast, f"grouped allreduce of {GROUP}": allreduce,
            "allgather": allgather, "reducescatter": reducescatter, "alltoall": alltoall}


FRESH = "MPI, fresh output"


def collectives(comm: MPI.Comm, sizes: list[int], rounds: int = 3,
                tensorflow: bool = False, with_allreduce: bool = False) -> list[dict]:
    """Per op and size (bytes a rank sends: the allgather's input, the reducescatter's
    input, the group's total): seconds per call of each path and of MPI (medians over
    alternating rounds), each path's ratio to MPI (MPI's time over the path's), and,
    for ops with both forms, the in-place path's time over the out-of-place one's.
    tensorflow: TensorFlow's calls too (every rank must say the same). with_allreduce:
    torch's allreduce too, in place and out of place (the main bench times it apart)."""
    rows = []
    fresh = _mpi_calls(comm, fresh_output=True)
    size = comm.Get_size()
    for op, (baseline, paths) in _ops(comm, tensorflow, with_allreduce).items():
        for nbytes in sizes:
            first = {}
            for path, make in paths:
                call = make(nbytes, f"bench.first.{path}.{nbytes}")
                _recycle(size * nbytes)
                first[path] = _first_call(call, comm)
            first["MPI"] = _first_call(baseline(nbytes, ""), comm)
            call = fresh[op](nbytes, "")
            _recycle(size * nbytes)
            first[FRESH] = _first_call(call, comm)
            contenders = {path: make(nbytes, f"bench.{path}.{nbytes}")
                          for path, make in paths}
            contenders["MPI"] = baseline(nbytes, "")
            times = alternating(contenders, comm, rounds)
            seconds = {key: statistics.median(values) for key, values in times.items()}
            mpi_s = seconds.pop("MPI")
            row = {"op": op, "bytes": nbytes, "mpi_s": mpi_s,
                   "paths": {path: {"seconds": s, "ratio_to_mpi": mpi_s / s}
                             for path, s in seconds.items()}}
            row["first_call_s"] = first
            row["first_over_later"] = {path: first[path] / s for path, s in seconds.items()}
            row["first_over_later"]["MPI"] = first["MPI"] / mpi_s
            # An out-of-place path's first call against MPI's that allocates its output.
            row["first_over_mpi_fresh"] = {path: first[path] / first[FRESH]
                                           for path in seconds if not path.endswith("_")}
            in_place = [p for p in seconds if p.endswith("_")]
            if in_place:
                out_of_place = in_place[0][:-1]
                row["in_place_over_out_of_place"] = \
                    seconds[in_place[0]] / seconds[out_of_place]
            rows.append(row)
    return rows


def _recycle(nbytes: int) -> None:
    """Write and free nbytes, so that a first call after it finds as much memory that
    this VM has just used, whatever ran before it. The first calls then compare setup,
    not where the kernel's free memory came from: on a VM whose host takes back memory
    freed for about 2 s (free page reporting), faulting in 512 MiB took 1.1-1.4 s fresh,
    0.06 s right after a free, 0.6-1.0 s 2-8 s after one (2-core x86 VM), and a call
    after another's frees would look 10-20x faster than one without."""
    if nbytes >= 1 << 20:
        scratch = np.empty(nbytes, np.uint8)
        scratch[::4096] = 1
        del scratch


def _first_call(call: Contender, comm: MPI.Comm) -> float:
    """Seconds of one call, the slowest rank's, with the ranks started together."""
    comm.Barrier()
    start = time.perf_counter()
    call()
    return comm.allreduce(time.perf_counter() - start, MPI.MAX)


def print_rows(rows: list[dict]) -> None:
    print("\nother collectives through torch and TensorFlow (tf) (time in us, ratio to MPI's "
          "own call on numpy buffers; in/out: torch's in-place form's time over its "
          "out-of-place one's)")
    for row in rows:
        cells = "  ".join(f"{path} {v['seconds'] * 1e6:.1f} ({v['ratio_to_mpi']:.2f}x)"
                          for path, v in row["paths"].items())
        extra = row.get("in_place_over_out_of_place")
        first = "  ".join(f"{path} {v:.1f}x" for path, v in row.get("first_over_later", {}).items())
        print(f"  {row['op']:26s} {row['bytes']:>9}  MPI {row['mpi_s'] * 1e6:9.1f}  {cells}"
              + (f"  in/out {extra:.2f}" if extra is not None else "")
              + (f"  first call/later: {first}" if first else "")
              + "".join(f"  {path} first/MPI's fresh first {v:.2f}"
                        for path, v in row.get("first_over_mpi_fresh", {}).items()))


def main(argv: list[str] | None = None) -> None:
    """The sweep alone, to sizes past the main bench's (up to 2 GiB)."""
    parser = argparse.ArgumentParser(prog="python -m horovodish.bench.collectives")
    parser.add_argument("--max-bytes", type=int, default=256 << 20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--record", metavar="FOLDER")
    args = parser.parse_args(argv)
    from .. import torch as hvd
    hvd.init()
    comm = MPI.COMM_WORLD.Dup()
    sizes = [s for s in SWEEP_SIZES if s <= args.max_bytes]
    rows = collectives(comm, sizes, args.rounds, with_allreduce=True)
    if comm.Get_rank() == 0:
        print_rows(rows)
        if args.record:
            from . import records
            command = (f"horovodishrun -np {comm.Get_size()} python -m horovodish.bench."
                       f"collectives {' '.join(argv if argv is not None else sys.argv[1:])}")
            figures = {"ranks": comm.Get_size(), "rounds": args.rounds, "rows": rows}
            kind = f"collectives-{comm.Get_size()}-ranks"
            print(f"record: {records.write(args.record, kind, figures, command.strip())}")
    comm.Free()
    hvd.shutdown()


if __name__ == "__main__":
    main()

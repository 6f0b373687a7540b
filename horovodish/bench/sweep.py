"""One synchronous allreduce per path and size, against MPI_Allreduce in the same run."""
from __future__ import annotations

import statistics

import numpy as np
from mpi4py import MPI

from .paths import Path
from .timing import alternating, busbw

SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]


def sweep(comm: MPI.Comm, sizes: list[int], paths: dict[str, Path], rounds: int = 3
          ) -> list[dict]:
    """Per size: seconds per call (median over rounds) and bus bandwidth of each path and
    of MPI, and each path's ratio to MPI (MPI's time over the path's: above 1 is faster
    than MPI). ``ratio`` (the first path's) keeps the old single-path name."""
    size = comm.Get_size()
    rows = []
    for nbytes in sizes:
        raw = np.zeros(nbytes // 4, dtype=np.float32)
        contenders = {path: make(nbytes, f"bench.{index}.{nbytes}")
                      for index, (path, (make, _)) in enumerate(paths.items())}
        contenders["MPI_Allreduce"] = lambda: comm.Allreduce(MPI.IN_PLACE, raw, op=MPI.SUM)
        times = alternating(contenders, comm, rounds)
        seconds = {key: statistics.median(values) for key, values in times.items()}
        mpi_s = seconds.pop("MPI_Allreduce")
        row = {"bytes": nbytes, "mpi_s": mpi_s, "mpi_busbw": busbw(nbytes, mpi_s, size),
               "paths": {path: {"seconds": s, "busbw": busbw(nbytes, s, size),
                                "ratio_to_mpi": mpi_s / s} for path, s in seconds.items()}}
        first = next(iter(row["paths"].values()))
        row.update(runtime_s=first["seconds"], runtime_busbw=first["busbw"],
                   ratio=first["ratio_to_mpi"])
        rows.append(row)
    return rows

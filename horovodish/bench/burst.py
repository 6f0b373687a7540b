"""Many small tensors submitted asynchronously, then synchronized, through each path,
against one MPI call on their concatenation and against one MPI call per tensor."""
from __future__ import annotations

import contextlib
import os
import statistics
import tempfile
from typing import Iterator

import numpy as np
from mpi4py import MPI

from ..common import api
from .paths import Path
from .timing import alternating


def burst(comm: MPI.Comm, paths: dict[str, Path], count: int = 256,
          nbytes: int = 16 << 10, rounds: int = 5) -> dict:
    concat = np.zeros(count * nbytes // 4, dtype=np.float32)
    separate_tensors = [np.zeros(nbytes // 4, dtype=np.float32) for _ in range(count)]

    def separate() -> None:
        for tensor in separate_tensors:
            comm.Allreduce(MPI.IN_PLACE, tensor, op=MPI.SUM)

    contenders = {path: make(count, nbytes, f"burst.{index}")
                  for index, (path, (_, make)) in enumerate(paths.items())}
    first = next(iter(paths))
    contenders["with timeline"] = paths[first][1](count, nbytes, "burst.timeline")
    contenders["one MPI call"] = lambda: comm.Allreduce(MPI.IN_PLACE, concat, op=MPI.SUM)
    contenders["separate MPI calls"] = separate
    with tempfile.TemporaryDirectory() as folder:
        @contextlib.contextmanager
        def timeline() -> Iterator[None]:
            api.start_timeline(os.path.join(folder, "timeline.json"))
            try:
                yield
            finally:
                api.stop_timeline()
        times = alternating(contenders, comm, rounds, around={"with timeline": timeline})
    seconds = {key: statistics.median(values) for key, values in times.items()}
    one, apart = seconds["one MPI call"], seconds["separate MPI calls"]
    result = {
        "count": count, "bytes_each": nbytes, "mpi_one_call_s": one, "mpi_separate_s": apart,
        "paths": {path: {"seconds": seconds[path], "over_one_call": seconds[path] / one,
                         "over_separate": seconds[path] / apart,
                         "over_one_call_per_round": [a / b for a, b in zip(
                             times[path], times["one MPI call"])]}
                  for path in paths},
        "runtime_with_timeline_s": seconds["with timeline"],
        "timeline_throughput_loss_percent": 100.0 * (1 - seconds[first]
                                                     / seconds["with timeline"]),
    }
    # The old single-path names, for comparison with earlier records.
    result.update(runtime_s=seconds[first], runtime_over_one_call=seconds[first] / one,
                  runtime_over_separate=seconds[first] / apart)
    return result

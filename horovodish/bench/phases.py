"""Where a synchronous allreduce's time goes, phase by phase, next to MPI's own call.

    horovodishrun -np 2 python -m horovodish.bench.phases [--sizes 4096,65536,...]

One in-place float32 Sum allreduce of a numpy array (the core API) at a time, as a
blocked caller runs it: the runtime's own methods are wrapped with timers in this job
only (the wrappers cost about a microsecond each, which the total includes). Per call,
on rank 0, the mean over the calls:

- submit: naming, checks and queueing (``allreduce_async``);
- start cycle: taking the queue, replaying the cache, posting the negotiation;
- negotiation wait: until every rank's bit vector is in (the ranks meet for the first
  time here, so a rank that arrives first waits for the other);
- finish cycle: planning, then ``execute``, whose backend data path (copies, barriers,
  the reduction, or MPI's call) is given apart; completion of the handle;
- the rest: the caller's loop around the cycle (locks, interrupt bookkeeping, waking).

MPI's ``MPI_Allreduce`` on a preallocated buffer of the same size, timed in the same job,
is the baseline. docs/tuning.md reads the table.
"""
from __future__ import annotations

import argparse
import time
from collections import defaultdict
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from ..common.api import collectives, lifecycle, process_state
from ..common.messages import ReduceOp
from .timing import time_per_call

PHASES = ("submit", "start cycle", "negotiation wait", "finish cycle", "  execute",
          "    backend data path", "the rest")


class _Timers:
    """Seconds per phase, summed over calls, from wrappers around runtime methods."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls = 0

    def wrap(self, owner: Any, attribute: str, phase: str) -> None:
        method: Callable[..., Any] = getattr(owner, attribute)
        seconds, clock = self.seconds, time.perf_counter

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = clock()
            try:
                return method(*args, **kwargs)
            finally:
                seconds[phase] += clock() - start
        setattr(owner, attribute, timed)  # on the instance: this job only

    def per_call(self) -> dict[str, float]:
        s = {key: value / max(self.calls, 1) for key, value in self.seconds.items()}
        cycle = s.get("caller cycle", 0.0)
        out = {"submit": s.get("submit", 0.0), "start cycle": s.get("start cycle", 0.0),
               "negotiation wait": cycle - s.get("start cycle", 0.0) - s.get(
                   "finish cycle", 0.0),
               "finish cycle": s.get("finish cycle", 0.0), "  execute": s.get("execute", 0.0),
               "    backend data path": s.get("backend", 0.0)}
        out["the rest"] = s.get("total", 0.0) - out["submit"] - cycle
        return out


def _instrument(timers: _Timers) -> None:
    runtime = process_state.state().runtime
    timers.wrap(runtime, "_start_cycle", "start cycle")
    timers.wrap(runtime, "_finish_cycle", "finish cycle")
    timers.wrap(runtime, "_caller_cycle", "caller cycle")
    timers.wrap(runtime.executor, "execute", "execute")
    for backend in runtime.executor.operations.backends:
        timers.wrap(backend, "allreduce_group", "backend")


def measure(nbytes: int, calls: int, comm: MPI.Comm) -> tuple[dict[str, float], float, float]:
    """(phase -> seconds per call, our total per call, MPI's per call)."""
    array = np.zeros(nbytes // 4, np.float32)
    name = f"bench.phases.{nbytes}"
    for _ in range(5):  # warm: the cache entry, the plans, the blocks
        collectives.allreduce_async(array, array, name, ReduceOp.SUM).wait()
    timers = _Timers()
    _instrument(timers)
    clock = time.perf_counter
    comm.Barrier()
    for _ in range(calls):
        start = clock()
        handle = collectives.allreduce_async(array, array, name, ReduceOp.SUM)
        submitted = clock()
        handle.wait()
        end = clock()
        timers.seconds["submit"] += submitted - start
        timers.seconds["total"] += end - start
    timers.calls = calls
    total = timers.seconds["total"] / calls
    _uninstrument()
    recv = np.zeros_like(array)
    mpi = time_per_call(lambda: comm.Allreduce(array, recv, op=MPI.SUM), comm, budget=0.3)
    return timers.per_call(), total, mpi


def _uninstrument() -> None:
    runtime = process_state.state().runtime
    for owner in [runtime, runtime.executor, *runtime.executor.operations.backends]:
        for attribute in ("_start_cycle", "_finish_cycle", "_caller_cycle", "execute",
                          "allreduce_group"):
            owner.__dict__.pop(attribute, None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4096,65536,262144,1048576,4194304",
                        help="bytes, comma-separated")
    parser.add_argument("--calls", type=int, default=300, help="per size")
    args = parser.parse_args()
    lifecycle.init()
    comm = MPI.COMM_WORLD
    rows = []
    for nbytes in (int(s) for s in args.sizes.split(",")):
        calls = max(20, min(args.calls, int(args.calls * (1 << 20) / max(nbytes, 1))))
        rows.append((nbytes, *measure(nbytes, calls, comm)))
    runtime = process_state.state().runtime
    if comm.Get_rank() == 0:
        print(f"bench.phases: {process_state.size()} ranks, float32 Sum in place, "
              f"synchronous, us per call on rank 0 (mean); backends chosen by size")
        print(f"{'phase':24s}" + "".join(f"{nbytes:>11d}" for nbytes, *_ in rows))
        for phase in PHASES:
            print(f"{phase:24s}" + "".join(f"{row[1][phase] * 1e6:11.1f}" for row in rows))
        print(f"{'total':24s}" + "".join(f"{row[2] * 1e6:11.1f}" for row in rows))
        print(f"{'MPI_Allreduce':24s}" + "".join(f"{row[3] * 1e6:11.1f}" for row in rows))
        print(f"{'MPI / total':24s}" + "".join(f"{row[3] / row[2]:10.2f}x" for row in rows))
        print(f"(cycles handed to the runtime thread meanwhile: {runtime.handovers})")
    lifecycle.shutdown()


if __name__ == "__main__":
    main()

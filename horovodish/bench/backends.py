"""Single tensors through each host backend, in one job: which one should take them.

    horovodishrun -np 2 python -m horovodish.bench.backends [--rounds 5]

For each size, one synchronous float32 Sum allreduce of a numpy array (the core API) and,
if torch is installed, of a torch tensor in place (``allreduce_``) and out of place
(``allreduce``), timed in alternating rounds with the default choice and with each host
backend forced (shm, ring, mpi). The running job switches backends between rounds (what
``HOROVODISH_CPU_OPERATIONS`` would fix for a whole job), so a slow spell of a shared
machine hits every contender. Printed: each one's median time per call and the median of
its per-round ratios to the default (below 1: faster than the default). Why the numpy and
torch rows differ, and the figures: docs/tuning.md.
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
from typing import Callable, Iterator

import numpy as np
from mpi4py import MPI

from ..common.api import collectives, lifecycle, process_state
from ..common.messages import ReduceOp
from .timing import Contender, alternating

MODES = (None, "shm", "ring", "mpi")  # None: the default choice


@contextlib.contextmanager
def forced(mode: str | None) -> Iterator[None]:
    """The shm and ring backends as CPU_OPERATIONS=mode would build them (None: default);
    MPI takes what they refuse."""
    backends = [b for b in process_state.state().runtime.executor.operations.backends
                if b.name in ("shm", "ring")]
    before = [b.mode for b in backends]
    for backend in backends:
        backend.mode = mode
    try:
        yield
    finally:
        for backend, mode_before in zip(backends, before):
            backend.mode = mode_before


def paths(nbytes: int) -> dict[str, Callable[[str], Contender]]:
    """Path name -> a factory of one synchronous call under a given name."""
    array = np.zeros(nbytes // 4, np.float32)  # zeros: repeated sums never overflow
    made: dict[str, Callable[[str], Contender]] = {
        "numpy (core)": lambda name: lambda: collectives.allreduce_async(
            array, array, name, ReduceOp.SUM).wait()}
    try:
        import torch

        import horovodish.torch as hvd
    except ImportError:
        return made
    tensor = torch.zeros(nbytes // 4)
    made["torch allreduce_"] = lambda name: lambda: hvd.allreduce_(tensor, name=name,
                                                                   op=hvd.Sum)
    made["torch allreduce"] = lambda name: lambda: hvd.allreduce(tensor, name=name, op=hvd.Sum)
    return made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sizes", default="16384,65536,262144,1048576,4194304,16777216,"
                        "67108864", help="bytes, comma-separated")
    args = parser.parse_args()
    lifecycle.init()
    comm = MPI.COMM_WORLD
    if process_state.size() < 2 or not _one_host(comm):
        raise SystemExit("bench.backends compares host backends: run 2 or more ranks on "
                         "one host")
    # Backends are what this compares: eager cycles would take sizes up to 2 MiB past
    # them (every rank switches them off here, before any collective of its own).
    process_state.state().runtime.set_eager_limit(0, 0)
    sizes = [int(s) for s in args.sizes.split(",")]
    if comm.Get_rank() == 0:
        print(f"bench.backends: {process_state.size()} ranks, float32 Sum, synchronous; median "
              f"us per call over {args.rounds} rounds, and the median ratio to the default")
        print(f"{'bytes':>10} {'path':18s} " + " ".join(
            f"{mode or 'default':>16s}" for mode in MODES))
    for nbytes in sizes:
        for path, make in paths(nbytes).items():
            fns = {str(mode): make(f"bench.backends.{path}.{nbytes}.{mode}")
                   for mode in MODES}
            around = {str(mode): (lambda m=mode: forced(m)) for mode in MODES}
            times = alternating(fns, comm, rounds=args.rounds, budget=0.05, around=around)
            if comm.Get_rank() == 0:
                default = times["None"]
                cells = []
                for mode in MODES:
                    mine = times[str(mode)]
                    ratio = statistics.median(t / d for t, d in zip(mine, default))
                    cells.append(f"{statistics.median(mine) * 1e6:9.1f} ({ratio:4.2f})")
                print(f"{nbytes:>10} {path:18s} " + " ".join(cells), flush=True)
    lifecycle.shutdown()


def _one_host(comm: MPI.Comm) -> bool:
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return bool(comm.allreduce(node.Get_size() == comm.Get_size(), op=MPI.LAND))
    finally:
        node.Free()


if __name__ == "__main__":
    main()

"""Assembling one runtime: its controller, transport, backends, executor and thread.

One per process set (the global set included); the API's lifecycle calls it, and it is
the only place that knows every stage's class.
"""
from __future__ import annotations

from typing import Any

from mpi4py import MPI

from ..autotune import Autotuner, Params
from ..config import Config
from ..execution.backends.adasum import AdasumBackend
from ..execution.backends.hierarchical import HierarchicalBackend
from ..execution.backends.mpi import MPIBackend
from ..execution.backends.nccl import NcclBackend
from ..execution.backends.ring import RingBackend
from ..execution.backends.shm import SharedMemoryBackend
from ..execution.cuda import GpuOperations
from ..negotiation.shm_exchange import TURNS
from ..execution.executor import Executor
from ..execution.operations import OperationManager
from ..negotiation.controller import Controller
from ..negotiation.eager_plan import CROSS_HOST_EAGER_LIMIT, SPLIT_EAGER_LIMIT, EagerPredictor
from ..negotiation.mpi_transport import MPITransport
from ..peer_wait import Patience
from ..stall import StallInspector
from .thread import Runtime


def build_runtime(comm: Any, config: Config, record_timeline: bool = False,
                  world_ranks: list[int] | None = None,
                  gpu: GpuOperations = GpuOperations()) -> Any:
    """A runtime thread with its own controller, coordinator, cache and backends on comm.

    world_ranks: for a process set, the world rank of each set rank (what messages say).
    gpu: the path of CUDA tensors chosen at init(); with NCCL in it, the NCCL backend
    (whose communicator is created at the set's first CUDA collective) runs CUDA views."""

    rank, size = comm.Get_rank(), comm.Get_size()
    timeline = record_timeline and config.timeline and config.timeline.upper() != "DYNAMIC"
    _check_files(comm, [("timeline", config.timeline if timeline else None),
                        ("autotune log", config.autotune_log if config.autotune else None)])
    stall = None
    if not config.stall_check_disable and size > 1:
        stall = StallInspector(size, config.stall_check_time, config.stall_shutdown_time,
                               world_ranks=world_ranks)
    # How long a meeting waits for a rank that takes no part at all (peer_wait.py).
    patience = Patience(config.stall_check_time, config.stall_shutdown_time) \
        if stall and config.stall_check_time > 0 else None
    backends = [AdasumBackend(comm),
                # Across hosts only (and shared memory within one host only).
                HierarchicalBackend(comm, config.hierarchical_allreduce,
                                    config.cpu_operations, world_ranks=world_ranks,
                                    gather=bool(config.hierarchical_allgather),
                                    patience=patience),
                SharedMemoryBackend(comm, config.cpu_operations, world_ranks=world_ranks,
                                    single_below=config.ring_threshold, patience=patience),
                RingBackend(comm, config.ring_threshold, config.cpu_operations),
                MPIBackend(comm)]
    if gpu.uses_nccl:
        backends.insert(0, NcclBackend(comm))
    transport = MPITransport(comm, patience, world_ranks)
    controller = Controller(transport, config.cache_capacity, stall,
                            world_ranks=world_ranks)
    executor = Executor(OperationManager(backends), rank, size)
    # A blocked caller runs cycles itself, so MPI is called from its thread too.
    caller_runs = config.caller_runs and MPI.Query_thread() == MPI.THREAD_MULTIPLE
    # Small steady allreduces ride on the negotiation, unless a backend or algorithm
    # was asked for by name: then that is what runs them.
    eager = None
    if size > 1:
        limit = config.eager_limit
        if config.cpu_operations is not None or config.hierarchical_allreduce:
            limit = 0
        elif not transport.one_host and "EAGER_LIMIT" not in config.explicit:
            limit = min(limit, CROSS_HOST_EAGER_LIMIT)
        # Ranks that planned with different limits would run different collectives in
        # the same cycle and hang: the smallest applies everywhere.
        limit = comm.allreduce(limit, op=MPI.MIN)
        if limit:
            # By slices above the limit only through shared memory (a second barrier
            # there costs a few us; across hosts it would be a round trip).
            # The window holds TURNS regions a rank: at most 64 MiB in all for this.
            split = min(SPLIT_EAGER_LIMIT, (64 << 20) // (TURNS * size)) \
                if transport.one_host else 0
            eager = EagerPredictor(size, limit, split)
    runtime = Runtime(controller, executor, config.fusion_threshold, config.cycle_time_ms,
                      stall_message=(lambda: stall.last_report) if stall else None,
                      caller_runs=caller_runs, eager=eager,
                      patience=patience)
    if config.autotune and rank == 0:
        runtime.autotuner = Autotuner(
            Params(config.fusion_threshold, config.cycle_time_ms),
            tune_fusion="FUSION_THRESHOLD" not in config.explicit,
            tune_cycle="CYCLE_TIME" not in config.explicit, log_path=config.autotune_log)
    if timeline:
        runtime.start_timeline(config.timeline, config.timeline_mark_cycles)
    return runtime


def _check_files(comm: Any, files: list[tuple[str, str | None]]) -> None:
    """Open the files rank 0 will write before anything collective starts, and raise the
    same ValueError on every rank if one fails: a bad path raised on rank 0 alone, after
    its runtime thread had started, and the other ranks waited in init() for good."""
    paths = [(what, path) for what, path in files if path]
    if not paths:  # (the same configuration on every rank: all skip the broadcast)
        return
    error = None
    if comm.Get_rank() == 0:
        for what, path in paths:
            try:
                with open(path, "a"):
                    pass
            except OSError as exc:
                error = f"cannot write the {what} file {path!r} on rank 0: {exc.strerror or exc}"
                break
    error = comm.bcast(error, root=0)
    if error is not None:
        raise ValueError(error)



"""init / shutdown and the topology queries every adapter re-exports.

``init()`` builds the MPI communicators, the controller, the backends and the runtime
thread. Without a launcher it gives a world of one (MPI singleton init). Calling it
twice is harmless; ``shutdown()`` stops the thread and fails whatever is still in flight.
"""
from __future__ import annotations

import atexit
import importlib.util
import threading
from dataclasses import dataclass, field
from typing import Any, Sequence

from . import exit_hook, interrupts
from .config import Config
from .errors import not_initialized_error


@dataclass
class _State:
    config: Config
    comm: Any
    manage_comm: Any  # main-thread only: creating process sets; never used by a runtime
    local_comm: Any
    cross_comm: Any
    runtime: Any
    rank: int
    size: int
    dynamic_process_sets: bool = False
    homogeneous: bool = True  # every host runs as many ranks (Horovod's is_homogeneous)
    process_sets: dict[int, Any] = field(default_factory=dict)
    next_process_set_id: int = 1
    registration_calls: int = 0  # add/remove_process_set calls so far (the same on every rank)


_state: _State | None = None
_lock = threading.Lock()
_atexit_registered = False
_initialized_once = False  # init() succeeded at some point (see exit_hook)
exit_hook.install(lambda: _initialized_once)


def build_runtime(comm: Any, config: Config, record_timeline: bool = False,
                  world_ranks: list[int] | None = None) -> Any:
    """A runtime thread with its own controller, coordinator, cache and backends on comm.

    world_ranks: for a process set, the world rank of each set rank (what messages say)."""
    from .backends.adasum import Adasum
    from .backends.mpi import MPIBackend
    from .backends.ring import RingBackend
    from .backends.shm import SharedMemoryBackend
    from .controller import Controller
    from .executor import Executor
    from .mpi_transport import MPITransport
    from .operations import OperationManager
    from .runtime import Runtime
    from .stall import StallInspector

    rank, size = comm.Get_rank(), comm.Get_size()
    timeline = record_timeline and config.timeline and config.timeline.upper() != "DYNAMIC"
    _check_files(comm, [("timeline", config.timeline if timeline else None),
                        ("autotune log", config.autotune_log if config.autotune else None)])
    stall = None
    if not config.stall_check_disable and size > 1:
        stall = StallInspector(size, config.stall_check_time, config.stall_shutdown_time,
                               world_ranks=world_ranks)
    backends = [SharedMemoryBackend(comm, config.cpu_operations, world_ranks=world_ranks),
                RingBackend(comm, config.ring_threshold, config.cpu_operations),
                MPIBackend(comm)]
    controller = Controller(MPITransport(comm), config.cache_capacity, stall,
                            world_ranks=world_ranks)
    executor = Executor(OperationManager(backends), rank, size, Adasum(comm))
    from mpi4py import MPI
    # A blocked caller runs cycles itself, so MPI is called from its thread too.
    caller_runs = config.caller_runs and MPI.Query_thread() == MPI.THREAD_MULTIPLE
    runtime = Runtime(controller, executor, config.fusion_threshold, config.cycle_time_ms,
                      stall_message=(lambda: stall.last_report) if stall else None,
                      caller_runs=caller_runs)
    if config.autotune and rank == 0:
        from .autotune import Autotuner, Params
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


def init(comm: Any = None, process_sets: Any = None) -> None:
    """Start horovodish on this process (collective: every rank must call it).

    ``comm`` may be an mpi4py communicator or a list of world ranks, as in Horovod.
    ``process_sets`` is a list of ProcessSet to create now, or "dynamic" to allow
    add_process_set()/remove_process_set() later.
    """
    global _state, _atexit_registered, _initialized_once
    with _lock:
        if _state is not None and not _state.runtime.stopped:
            return
        config = Config.from_env()
        from mpi4py import MPI

        from .logging_setup import configure, warn_once
        from .process_sets import global_process_set

        base = MPI.COMM_WORLD if comm is None else comm
        if isinstance(base, Sequence):
            ranks = list(base)
            group = MPI.COMM_WORLD.Get_group().Incl(ranks)
            base = MPI.COMM_WORLD.Create(group)  # collective over the world
            if base == MPI.COMM_NULL:
                raise ValueError(
                    f"init(comm={ranks}): this process (world rank "
                    f"{MPI.COMM_WORLD.Get_rank()}) is not in the list, so it has no "
                    "horovodish world; skip horovodish on it, or list every rank.")
        world = base.Dup()
        rank, size = world.Get_rank(), world.Get_size()
        logger = configure(rank, config.log_level)
        if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
            warn_once("MPI was initialized without MPI_THREAD_MULTIPLE; do not call MPI from "
                      "your own threads while horovodish runs.")
        local = world.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
        cross = world.Split(local.Get_rank(), key=rank)
        homogeneous = len(set(world.allgather(local.Get_size()))) == 1
        if config.caller_runs:
            interrupts.install()  # lets the main thread run cycles (see interrupts.py)
        runtime = build_runtime(world, config, record_timeline=True)
        dynamic = process_sets == "dynamic" or config.dynamic_process_sets
        _state = _State(config, world, world.Dup(), local, cross, runtime, rank, size, dynamic,
                        homogeneous=homogeneous)
        # Set ids start from 1 again, maybe with other members: so do unnamed ops' numbers.
        from .collectives import reset_auto_names
        reset_auto_names()
        _initialized_once = True
        global_process_set.ranks = list(range(size))
        global_process_set.process_set_id = 0
        global_process_set.runtime, global_process_set.comm = runtime, world
        _state.process_sets[0] = global_process_set
        if not _atexit_registered:
            atexit.register(shutdown)
            _atexit_registered = True
        logger.debug("initialized: rank %d of %d, config %s", rank, size, config)
    if isinstance(process_sets, (list, tuple)):
        for process_set in process_sets:
            register_process_set(process_set)


def register_process_set(process_set: Any) -> None:
    """Create the set's communicator and, on members, its runtime (collective).

    The ranks first agree through the global runtime (see _agree)."""
    state_ = state()
    from mpi4py import MPI
    manage = state_.manage_comm
    problem = _registration_problem(state_, process_set)
    ranks = list(process_set.ranks or []) if problem is None else []
    _agree(state_, ("add_process_set", ranks, problem))
    sub = manage.Create(manage.Get_group().Incl(ranks))
    process_set.process_set_id = state_.next_process_set_id
    state_.next_process_set_id += 1
    if sub != MPI.COMM_NULL:
        process_set.comm = sub
        process_set.runtime = build_runtime(sub, state_.config, world_ranks=ranks)
    state_.process_sets[process_set.process_set_id] = process_set


def _registration_problem(state_: _State, process_set: Any) -> str | None:
    """What this rank alone sees wrong with registering process_set (None: nothing);
    resolves a set given as a communicator to its world ranks on the way."""
    from mpi4py import MPI
    if process_set.process_set_id is not None:
        return f"{process_set!r} is already registered"
    source = process_set._comm_source
    if source is not None:
        if source == MPI.COMM_NULL:  # comm.Split(MPI.UNDEFINED, ...) gives it
            return ("its communicator is MPI.COMM_NULL; give every rank a communicator it "
                    "is in, or pass the same list of ranks on every rank")
        manage = state_.manage_comm
        try:
            process_set.ranks = sorted(MPI.Group.Translate_ranks(
                source.Get_group(), list(range(source.Get_size())), manage.Get_group()))
        except MPI.Exception as exc:
            return f"its communicator cannot be read ({exc})"
    ranks = list(process_set.ranks or [])
    if not ranks or len(set(ranks)) != len(ranks) or \
            not all(0 <= r < state_.size for r in ranks):
        return f"process set ranks {ranks} must be distinct ranks in 0..{state_.size - 1}"
    for existing in state_.process_sets.values():
        if existing.ranks == ranks and existing.process_set_id != 0:
            # Horovod's rule: one set per group of ranks (two would share nothing but
            # the ranks, and unnamed ops of the two would be numbered apart).
            return (f"a process set with ranks {ranks} already exists (process set id "
                    f"{existing.process_set_id}). Use that ProcessSet, or call "
                    "hvd.remove_process_set() on it before adding these ranks again")
    return None


def unregister_process_set(process_set: Any) -> bool:
    """Stop the set's runtime and forget it (collective); False for a set not registered
    (on every rank: the ranks agree on that too)."""
    state_ = state()
    set_id = process_set.process_set_id
    registered = set_id not in (None, 0) and set_id in state_.process_sets
    problem = "the global process set cannot be removed" if set_id == 0 else None
    _agree(state_, ("remove_process_set", set_id if registered else None, problem))
    if not registered:
        return False
    state_.process_sets.pop(set_id)
    if process_set.runtime is not None:
        process_set.runtime.shutdown()  # members agree through their own negotiation
        _free_if_finished(process_set.runtime, [process_set.comm])
    process_set.runtime = process_set.comm = None
    process_set.process_set_id = None
    return True


def _agree(state_: _State, proposal: Any) -> None:
    """Gather every rank's proposal through the global runtime and raise the same
    ValueError on every rank if they cannot go ahead together. Through the runtime, a rank
    that fails meanwhile fails this call too; a bare MPI call on the main thread (the
    communicator's creation) would wait for it forever. Calls are numbered, so an add on
    one rank meets a remove on another under one name, and is reported."""
    from .objects import allgather_object
    from .process_sets import disagreement
    number = state_.registration_calls
    state_.registration_calls += 1
    problem = disagreement(allgather_object(proposal, name=f"process_set.call.{number}"))
    if problem is not None:
        raise ValueError(f"{proposal[0]}: {problem}")


def shutdown() -> None:
    """Stop the runtime thread; pending operations fail with HorovodInternalError."""
    global _state
    with _lock:
        state_, _state = _state, None
    if state_ is not None:
        _abort_if_failed(state_)
        for process_set in list(state_.process_sets.values()):
            if process_set.runtime is not None and process_set.process_set_id != 0:
                process_set.runtime.shutdown()
                _free_if_finished(process_set.runtime, [process_set.comm])
            process_set.runtime = process_set.comm = None
            process_set.process_set_id = None
        state_.runtime.shutdown()
        # Communicators are a finite resource (MPICH: 2048 per process): free ours, so
        # that init() and shutdown() can alternate indefinitely.
        _free_if_finished(state_.runtime, [state_.comm, state_.manage_comm,
                                           state_.local_comm, state_.cross_comm])


def _abort_if_failed(state_: _State) -> None:
    """A runtime that failed midway may have left other ranks inside a collective that
    this rank will never join: freeing communicators or finalizing MPI would then wait
    forever, here and there. End the job instead (the failure was already raised to
    the script, which is now ending or re-initializing, and cannot recover either)."""
    failed = [ps.runtime for ps in state_.process_sets.values()
              if ps.runtime is not None and ps.runtime.failed and ps.runtime.controller.size > 1]
    if failed:
        import logging

        from mpi4py import MPI
        logging.getLogger("horovodish").error(
            "aborting the job: horovodish shut down%s, and the other ranks may be waiting "
            "in a collective this rank can no longer join", failed[0]._stop_reason)
        MPI.COMM_WORLD.Abort(1)


def _free_if_finished(runtime: Any, comms: list[Any]) -> None:
    """Free communicators once the runtime thread that used them has exited (a thread
    still running after shutdown's timeout keeps them)."""
    if runtime.finished:
        for comm in comms:
            if comm is not None:
                comm.Free()


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Start recording a Chrome-trace timeline to file_path (written by rank 0)."""
    state().runtime.start_timeline(file_path, mark_cycles)


def stop_timeline() -> None:
    """Stop recording and close the timeline file; it stays valid JSON."""
    state().runtime.stop_timeline()


def state() -> _State:
    if _state is None:
        raise not_initialized_error()
    return _state


def is_initialized() -> bool:
    return _state is not None


def rank() -> int:
    return state().rank


def size() -> int:
    return state().size


def local_rank() -> int:
    return state().local_comm.Get_rank()


def local_size() -> int:
    return state().local_comm.Get_size()


def cross_rank() -> int:
    return state().cross_comm.Get_rank()


def cross_size() -> int:
    return state().cross_comm.Get_size()


def is_homogeneous() -> bool:
    """Whether every host runs the same number of ranks (decided at init)."""
    return state().homogeneous


def mpi_threads_supported() -> bool:
    from mpi4py import MPI
    state()
    return MPI.Query_thread() == MPI.THREAD_MULTIPLE


def mpi_enabled() -> bool:
    return is_initialized()


def mpi_built() -> bool:
    return importlib.util.find_spec("mpi4py") is not None


def gloo_built() -> bool:
    return False


def gloo_enabled() -> bool:
    """Horovod's Gloo controller; horovodish runs on MPI alone."""
    return False


def nccl_built() -> bool:
    """True when CuPy with its NCCL bindings imports (the nccl backend's requirement)."""
    try:
        from cupy.cuda import nccl  # noqa: F401
    except Exception:
        return False
    return True


def cuda_built() -> bool:
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def ccl_built() -> bool:
    return False


def ddl_built() -> bool:
    return False


def rocm_built() -> bool:
    return False


def sycl_built() -> bool:
    return False

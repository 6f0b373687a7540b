"""init / shutdown, adding and removing process sets, and the timeline switch.

``init()`` builds the MPI communicators and the global set's runtime (see
``runtime/assemble.py``). Under a launcher that is not MPI's own it first joins this
process to the job's MPI world (``world/mpi_start.py``). Without a launcher it gives a
world of one (MPI singleton init). Calling it twice is harmless; ``shutdown()`` stops the thread and fails whatever
is still in flight.
"""
from __future__ import annotations

import atexit
import logging
import os
import threading
from typing import Any, Sequence

from mpi4py import MPI

from ..config import Config
from ..execution.cuda import choose_gpu_operations
from ..huge_pages import kernel_mode, missing_tunable_hint
from ..logging_setup import configure, warn_once
from ..runtime import exit_hook, interrupts
from ..runtime.assemble import build_runtime
from ..runtime.heartbeat import HostWatchdog
from ..world.mpi_start import start_mpi
from . import process_state as _current
from .collectives import reset_auto_names
from .launch_check import refuse_lone_copies
from .process_set_registry import (free_if_finished, invalidate, register_all,
                                   register_process_set, unregister_process_set)
from .process_sets import ProcessSet, global_process_set
from .process_state import State, state

_lock = threading.Lock()
_atexit_registered = False
_initialized_once = False  # init() succeeded at some point (see exit_hook)
exit_hook.install(lambda: _initialized_once)


def init(comm: Any = None, process_sets: Any = None) -> None:
    """Start horovodish on this process (collective: every rank must call it).

    ``comm`` may be an mpi4py communicator or a list of world ranks, as in Horovod.
    ``process_sets`` is a list of ProcessSet to create now, or "dynamic" to allow
    add_process_set()/remove_process_set() later.
    """
    with _lock:
        current = _current.current()
        if current is not None and current.runtime.ranks_left:
            # Other ranks shut down and are leaving (their scripts ended): a new runtime
            # would wait for them in MPI_Comm_dup for ever. As Horovod's init() in that
            # state, nothing happens; a collective raises HorovodInternalError naming them.
            warn_once(f"init(): rank(s) {', '.join(map(str, current.runtime.ranks_left))} "
                      "shut down, so this job cannot run collectives any more; init() "
                      "does nothing. Call shutdown() and end this process.")
            return
        if current is None or current.runtime.stopped:
            _start(comm, process_sets)
    if isinstance(process_sets, (list, tuple)):
        # Also on a second init() (a library may have called it first): the sets are
        # registered, never silently dropped.
        register_all(process_sets)


def _start(comm: Any, process_sets: Any) -> None:
    """init()'s work on a process not yet initialized (the lock is held)."""
    global _atexit_registered, _initialized_once
    config = Config.from_env()
    start_mpi(config.start_timeout)
    refuse_lone_copies(MPI.COMM_WORLD.Get_size(), os.environ,
                       " ".join(MPI.Get_library_version().splitlines()[0].split()))
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
    if rank == 0 and size > 1:  # (glibc reads the tunable at start: only a hint)
        hint = missing_tunable_hint(os.environ, kernel_mode())
        if hint:
            warn_once(hint)
    local = world.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    cross = world.Split(local.Get_rank(), key=rank)
    homogeneous = len(set(world.allgather(local.Get_size()))) == 1
    if config.caller_runs:
        interrupts.install()  # lets the main thread run cycles (see interrupts.py)
    # Before any runtime exists: a rank that raises here (NCCL asked for and missing)
    # ends the job through exit_hook instead of leaving the others in a collective.
    gpu = choose_gpu_operations(config)
    # (Before the runtime thread starts using world: start() is collective over it.)
    watchdog = HostWatchdog.start(world, local, config.heartbeat_timeout)
    try:
        runtime = build_runtime(world, config, record_timeline=True, gpu=gpu)
    except BaseException:
        if watchdog is not None:
            watchdog.stop()
        raise
    dynamic = process_sets == "dynamic" or config.dynamic_process_sets
    new = State(config, world, world.Dup(), local, cross, runtime, rank, size, dynamic,
                homogeneous=homogeneous, gpu=gpu, watchdog=watchdog)
    _current.replace(new)
    # Set ids start from 1 again, maybe with other members: so do unnamed ops' numbers.
    reset_auto_names()
    _initialized_once = True
    global_process_set.ranks = list(range(size))
    global_process_set.process_set_id = 0
    global_process_set.runtime, global_process_set.comm = runtime, world
    # Horovod's: the communicator init() was given, None without one (or for a rank list)
    global_process_set.mpi_comm = comm if isinstance(comm, MPI.Comm) else None
    new.process_sets[0] = global_process_set
    if not _atexit_registered:
        atexit.register(shutdown)
        _atexit_registered = True
    logger.debug("initialized: rank %d of %d, config %s", rank, size, config)


def shutdown() -> None:
    """Stop the runtime thread; pending operations fail with HorovodInternalError."""
    with _lock:
        state_ = _current.replace(None)
    if state_ is not None:
        _abort_if_failed(state_)
        for set_id, record in list(state_.process_sets.items()):
            if record.runtime is not None and set_id != 0:
                record.runtime.shutdown()
                free_if_finished(record.runtime, [record.comm])
            for process_set in [*getattr(record, "_aliases", ()), record]:
                invalidate(process_set)
        state_.runtime.shutdown()
        if state_.watchdog is not None:
            state_.watchdog.stop()
        # Communicators are a finite resource (MPICH: 2048 per process): free ours, so
        # that init() and shutdown() can alternate indefinitely.
        free_if_finished(state_.runtime, [state_.comm, state_.manage_comm,
                                          state_.local_comm, state_.cross_comm])


def _abort_if_failed(state_: State) -> None:
    """A runtime that failed midway may have left other ranks inside a collective that
    this rank will never join: freeing communicators or finalizing MPI would then wait
    forever, here and there. End the job instead (the failure was already raised to
    the script, which is now ending or re-initializing, and cannot recover either)."""
    failed = [ps.runtime for ps in state_.process_sets.values()
              if ps.runtime is not None and ps.runtime.failed and ps.runtime.controller.size > 1]
    if failed:
        logging.getLogger("horovodish").error(
            "aborting the job: horovodish shut down%s, and the other ranks may be waiting "
            "in a collective this rank can no longer join", failed[0]._stop_reason)
        MPI.COMM_WORLD.Abort(1)


def add_process_set(process_set: ProcessSet | Sequence[int]) -> ProcessSet:
    """Register a new set (collective: every rank calls it, in the same order).

    Needs ``init(process_sets="dynamic")`` or HOROVODISH_DYNAMIC_PROCESS_SETS=1.
    """
    if not state().dynamic_process_sets:
        raise ValueError("add_process_set() needs dynamic process sets: call "
                         "hvd.init(process_sets='dynamic') or set HOROVODISH_DYNAMIC_PROCESS_SETS=1.")
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    register_process_set(process_set)
    return process_set


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister a set and stop its runtime (collective over all ranks)."""
    if not state().dynamic_process_sets:
        raise ValueError("remove_process_set() needs dynamic process sets: call "
                         "hvd.init(process_sets='dynamic').")
    return unregister_process_set(process_set)  # refuses the global set on every rank


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Start recording a Chrome-trace timeline to file_path (written by rank 0)."""
    state().runtime.start_timeline(file_path, mark_cycles)


def stop_timeline() -> None:
    """Stop recording and close the timeline file; it stays valid JSON."""
    state().runtime.stop_timeline()



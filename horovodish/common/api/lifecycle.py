"""init / shutdown, process-set registration and the timeline switch.

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
import weakref
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
from .objects import allgather_object
from .process_sets import ProcessSet, disagreement, global_process_set, new_groups
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
        _register_all(process_sets)


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


def _register_all(process_sets: Sequence[Any]) -> None:
    """init()'s sets, registered as Horovod registers them (collective). The groups of
    ranks not registered yet get ids in Horovod's order (new_groups: sets made from a
    communicator first, each of its groups under an id of its own), then each set takes
    the id of its group. A set whose group the global set or an earlier entry of the
    list has is a duplicate: it stays unregistered, and init() raises ValueError on
    the ranks where it is one, as Horovod's does. The groups stay registered either way,
    so a corrected list passed to init() again finds them."""
    sets = list(process_sets)
    if not sets:
        return
    state_ = state()
    entries: list[tuple[bool, list[int]]] = []
    problems = []
    for index, process_set in enumerate(sets):
        problem = _resolve_ranks(state_, process_set)
        if problem is not None:
            problems.append(f"process_sets entry number {index}: {problem}")
        entries.append((process_set._comm_source is not None,
                        list(process_set.ranks) if problem is None else []))
    proposals = _agree(state_, ("init", entries, "; ".join(problems) or None))
    _create_all(state_, new_groups([value for _, value, _ in proposals], _known(state_)))
    by_ranks = {tuple(record.ranks): record for record in state_.process_sets.values()}
    seen, duplicate = {0}, None
    for index, process_set in enumerate(sets):
        record = by_ranks[tuple(process_set.ranks)]
        if record.process_set_id in seen:
            if process_set is not record:
                _invalidate(process_set)
            duplicate = index if duplicate is None else duplicate
        else:
            seen.add(record.process_set_id)
            _adopt(process_set, record)
    if duplicate is not None:
        raise ValueError(
            f"init: process_sets entry number {duplicate} is a duplicate: "
            f"{sets[duplicate]!r} has the ranks of the global process set or of an earlier "
            "entry; pass each group of ranks once (the global set is always there).")


def register_process_set(process_set: Any) -> None:
    """add_process_set's work (collective): the ranks first agree through the global
    runtime (see _agree), then each new group gets its communicator, an id (a removed
    set's first, as in Horovod) and, on its members, a runtime."""
    state_ = state()
    if process_set.process_set_id is not None:
        problem: str | None = f"{process_set!r} is already registered"
    else:
        problem = _resolve_ranks(state_, process_set) or _existing(state_, process_set.ranks)
    ranks = list(process_set.ranks or []) if problem is None else []
    proposals = _agree(state_, ("add_process_set", ranks, problem))
    _create_all(state_, new_groups([[(True, value)] for _, value, _ in proposals],
                                   _known(state_)))
    _adopt(process_set, _registered_with(state_, ranks))


def _registered_with(state_: State, ranks: list[int]) -> ProcessSet | None:
    """The registered set (the table's own) with these ranks, or None."""
    return next((record for record in state_.process_sets.values() if record.ranks == ranks),
                None)


def _known(state_: State) -> set[tuple[int, ...]]:
    return {tuple(record.ranks) for record in state_.process_sets.values()}


def _create_all(state_: State, groups: list[tuple[int, ...]]) -> None:
    """Register each group (every rank passes the same groups, in the same order): its
    communicator (collective over all ranks) and, on members, its runtime. The table
    holds a set of its own per group; the user's sets adopt it (_adopt)."""
    manage = state_.manage_comm
    for group in groups:
        ranks = list(group)
        sub = manage.Create(manage.Get_group().Incl(ranks))
        record = ProcessSet(ranks)
        free = state_.free_process_set_ids
        if free:
            record.process_set_id = free.popleft()
        else:
            record.process_set_id = state_.next_process_set_id
            state_.next_process_set_id += 1
        if sub != MPI.COMM_NULL:
            record.comm = sub
            record.runtime = build_runtime(sub, state_.config, world_ranks=ranks,
                                           gpu=state_.gpu)
        record._aliases = weakref.WeakSet()
        state_.process_sets[record.process_set_id] = record


def _adopt(process_set: ProcessSet, record: ProcessSet) -> None:
    """The user's set now stands for the registered one (until it is removed)."""
    if process_set is not record:
        process_set.process_set_id, process_set.ranks = record.process_set_id, list(record.ranks)
        process_set.runtime, process_set.comm = record.runtime, record.comm
        record._aliases.add(process_set)


def _invalidate(process_set: ProcessSet) -> None:
    process_set.process_set_id = None
    process_set.runtime = process_set.comm = None


def _resolve_ranks(state_: State, process_set: Any) -> str | None:
    """Resolve a set made from a communicator to its world ranks; what this rank alone
    sees wrong with the set's ranks, or None."""
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
    return None


def _existing(state_: State, ranks: list[int]) -> str | None:
    """add_process_set's refusal of ranks a registered set has (Horovod's rule: one set
    per group of ranks, the global set's included)."""
    existing = _registered_with(state_, ranks)
    if existing is None:
        return None
    if existing.process_set_id == 0:
        return (f"a process set with ranks {ranks} already exists: the global process set "
                "(id 0); use hvd.global_process_set")
    return (f"a process set with ranks {ranks} already exists (process set id "
            f"{existing.process_set_id}). Use that ProcessSet, or call "
            "hvd.remove_process_set() on it before adding these ranks again")


def unregister_process_set(process_set: Any) -> bool:
    """Stop the set's runtime and forget it (collective); False for a set not registered
    and for the global set (on every rank: the ranks agree on that too). Each rank may
    name the group it is in, of sets added from one comm.Split: all of them go."""
    state_ = state()
    set_id = process_set.process_set_id
    record = state_.process_sets.get(set_id) if set_id else None
    registered = record is not None and record.ranks == process_set.ranks
    proposals = _agree(state_, ("remove_process_set", set_id if registered else None, None),
                       {i: record.ranks for i, record in state_.process_sets.items()})
    if not registered:
        return False
    for removed_id in sorted({value for _, value, _ in proposals}):
        removed = state_.process_sets.pop(removed_id)
        state_.free_process_set_ids.append(removed_id)
        reset_auto_names(removed_id)
        if removed.runtime is not None:
            removed.runtime.shutdown()  # members agree through their own negotiation
            _free_if_finished(removed.runtime, [removed.comm])
        for alias in [*removed._aliases, removed]:
            _invalidate(alias)
    _invalidate(process_set)
    return True


def _agree(state_: State, proposal: Any, groups: dict[int, list[int]] | None = None
           ) -> list[Any]:
    """Gather every rank's proposal through the global runtime and raise the same
    ValueError on every rank if they cannot go ahead together. Through the runtime, a rank
    that fails meanwhile fails this call too; a bare MPI call on the main thread (the
    communicator's creation) would wait for it forever. Calls are numbered, so an add on
    one rank meets a remove on another under one name, and is reported."""
    number = state_.registration_calls
    state_.registration_calls += 1
    proposals = allgather_object(proposal, name=f"process_set.call.{number}")
    problem = disagreement(proposals, groups)
    if problem is not None:
        raise ValueError(f"{proposal[0]}: {problem}")
    return proposals


def shutdown() -> None:
    """Stop the runtime thread; pending operations fail with HorovodInternalError."""
    with _lock:
        state_ = _current.replace(None)
    if state_ is not None:
        _abort_if_failed(state_)
        for set_id, record in list(state_.process_sets.items()):
            if record.runtime is not None and set_id != 0:
                record.runtime.shutdown()
                _free_if_finished(record.runtime, [record.comm])
            for process_set in [*getattr(record, "_aliases", ()), record]:
                _invalidate(process_set)
        state_.runtime.shutdown()
        if state_.watchdog is not None:
            state_.watchdog.stop()
        # Communicators are a finite resource (MPICH: 2048 per process): free ours, so
        # that init() and shutdown() can alternate indefinitely.
        _free_if_finished(state_.runtime, [state_.comm, state_.manage_comm,
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


def _free_if_finished(runtime: Any, comms: list[Any]) -> None:
    """Free communicators once the runtime thread that used them has exited (a thread
    still running after shutdown's timeout keeps them)."""
    if runtime.finished:
        for comm in comms:
            if comm is not None:
                comm.Free()


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



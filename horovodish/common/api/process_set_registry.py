"""The process-set registry: the sets init() is given, add_process_set and
remove_process_set's work, all collective over every rank.

The ranks first agree through the global runtime (``_agree``); then each new group of
ranks gets its communicator, an id and, on its members, a runtime. The table
(``State.process_sets``) holds a set of its own per group, and the user's sets stand for
it (``_adopt``) until it is removed.
"""
from __future__ import annotations

import weakref
from typing import Any, Sequence

from mpi4py import MPI

from ..runtime.assemble import build_runtime
from .collectives import reset_auto_names
from .objects import allgather_object
from .process_sets import ProcessSet, disagreement, new_groups
from .process_state import State, state


def register_all(process_sets: Sequence[Any]) -> None:
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
                invalidate(process_set)
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


def invalidate(process_set: ProcessSet) -> None:
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
            free_if_finished(removed.runtime, [removed.comm])
        for alias in [*removed._aliases, removed]:
            invalidate(alias)
    invalidate(process_set)
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


def free_if_finished(runtime: Any, comms: list[Any]) -> None:
    """Free communicators once the runtime thread that used them has exited (a thread
    still running after shutdown's timeout keeps them)."""
    if runtime.finished:
        for comm in comms:
            if comm is not None:
                comm.Free()

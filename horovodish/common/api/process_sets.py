"""Process sets: groups of ranks that run collectives among themselves.

Each set negotiates on its own: it has its own communicator, runtime thread, coordinator
(the set's lowest rank), response cache and queue, so sets make progress independently.
Creating and removing sets is collective over all ranks, as in Horovod (process_set_registry.py).
"""
from __future__ import annotations

from typing import Any, Sequence

from . import process_state


class ProcessSet:
    """A group of ranks, given as world ranks or as an mpi4py communicator.

        evens = hvd.ProcessSet([0, 2])
        hvd.init(process_sets=[evens])
        if evens.included():
            hvd.allreduce(t, process_set=evens)
    """

    def __init__(self, ranks: Sequence[int] | Any | None = None) -> None:
        self._comm_source = None
        if ranks is not None and hasattr(ranks, "Get_group"):
            self._comm_source = ranks  # resolved to world ranks at registration
            ranks = None
        # Horovod's attribute: the mpi4py communicator the set was made from (for the
        # global set, the one init() was given, else COMM_WORLD); None for a rank list.
        self.mpi_comm: Any = self._comm_source
        self.ranks: list[int] | None = sorted(int(r) for r in ranks) if ranks is not None \
            else None
        self.process_set_id: int | None = None
        self.runtime: Any = None
        self.comm: Any = None

    def __repr__(self) -> str:  # Horovod's str() of a set
        return (f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, "
                f"mpi_comm={self.mpi_comm})")

    def _require_registered(self) -> None:
        if self.process_set_id is None:
            process_state.state()  # before init(): the error that says to call it
            raise ValueError(f"{self!r} is not registered: pass it to hvd.init(process_sets=...) "
                             "or call hvd.add_process_set() first.")

    def size(self) -> int:
        self._require_registered()
        return len(self.ranks)

    def rank(self) -> int:
        """This process's rank within the set, or -1 if it is not a member."""
        self._require_registered()
        me = process_state.rank()
        return self.ranks.index(me) if me in self.ranks else -1

    def included(self) -> bool:
        self._require_registered()
        return process_state.rank() in self.ranks

    def set_rank_of(self, world_rank: int, what: str) -> int:
        """A world rank (as users pass root_rank) as a rank within this set."""
        if world_rank not in self.ranks:
            raise ValueError(f"{what} {world_rank} is not a member of process set {self.ranks}; "
                             "give the world rank of a member.")
        return self.ranks.index(world_rank)


global_process_set = ProcessSet(None)

# What each rank proposes to a registration call: the call ("init", "add_process_set" or
# "remove_process_set"), its value (init: per listed set, whether it was made from a
# communicator and its ranks; add: the rank list; remove: the set's id, None for a set
# not registered), and a problem this rank found on its own (None if none), which every
# rank then raises.
Proposal = tuple[str, Any, "str | None"]
ListedSet = tuple[bool, list[int]]  # init's per set: (made from a communicator, ranks)


def disagreement(proposals: Sequence[Proposal],
                 groups: dict[int, list[int]] | None = None) -> str | None:
    """Why the ranks' proposals cannot go ahead together, or None if they can.

    A set may have the same ranks on every rank, or give each rank the group it is in,
    which its fellow members give too: disjoint groups (what ProcessSet(comm.Split(...))
    gives), each registered under an id of its own, as in Horovod. A remove may likewise
    name each rank's group (ids looked up in groups, the registered sets' ranks)."""
    calls = {call for call, _, _ in proposals}
    if len(calls) > 1:
        said = "; ".join(f"rank {rank}: {call}({value})"
                         for rank, (call, value, _) in enumerate(proposals))
        return f"the ranks made different calls ({said}); every rank makes the same calls " \
               "in the same order."
    (call,) = calls
    found = [problem for _, _, problem in proposals]
    if found[0] is not None and all(problem == found[0] for problem in found):
        return f"{found[0]} (on every rank)"  # once, not once per rank
    problems = [f"rank {rank}: {problem}" for rank, problem in enumerate(found)
                if problem is not None]
    if problems:
        return "; ".join(problems)
    values = [value for _, value, _ in proposals]
    if call == "init":
        return _init_disagreement(values)
    if all(value == values[0] for value in values):
        return None
    if call == "add_process_set" and _partition(values):
        return None
    if call == "remove_process_set" and groups is not None and \
            all(value in groups for value in values) and \
            _partition([groups[value] for value in values]):
        return None
    said = "; ".join(f"rank {rank}: {value}" for rank, value in enumerate(values))
    if call == "add_process_set":
        return (f"the ranks passed different rank lists ({said}); every rank passes the "
                "same list, or the group of ranks it belongs to, which each of them passes "
                "too.")
    return f"the ranks passed different process sets (ids: {said}); every rank passes the " \
           "same set."


def _partition(lists: Sequence[list[int]]) -> bool:
    """Whether each rank's list holds that rank, and every member of it gives that list."""
    return all(rank in ranks and all(lists[member] == ranks for member in ranks)
               for rank, ranks in enumerate(lists))


def _init_disagreement(entries: Sequence[Sequence[ListedSet]]) -> str | None:
    counts = [len(listed) for listed in entries]
    if len(set(counts)) > 1:
        said = "; ".join(f"rank {rank}: {count}" for rank, count in enumerate(counts))
        return f"the ranks passed different numbers of process sets ({said}); every rank " \
               "passes the same list."
    for index in range(counts[0]):
        column = [listed[index][1] for listed in entries]
        if all(ranks == column[0] for ranks in column) or _partition(column):
            continue
        said = "; ".join(f"rank {rank}: {ranks}" for rank, ranks in enumerate(column))
        return (f"process_sets entry number {index} has different ranks on different ranks "
                f"({said}); every rank passes the same ranks, or the group of ranks it "
                "belongs to, which each of them passes too.")
    return None


def new_groups(entries: Sequence[Sequence[ListedSet]], known: set[tuple[int, ...]]
               ) -> list[tuple[int, ...]]:
    """The groups of ranks a registration adds, from every rank's entries, in the order
    Horovod numbers them: the sets made from communicators first, in list order, each
    one's groups sorted; then the sets of ranks, in list order. Groups in known (the
    registered sets') or met before are left out. The same on every rank."""
    count = len(entries[0]) if entries else 0
    from_comm = [any(listed[index][0] for listed in entries) for index in range(count)]
    order = [index for index in range(count) if from_comm[index]] + \
        [index for index in range(count) if not from_comm[index]]
    seen, groups = set(known), []
    for index in order:
        for group in sorted({tuple(listed[index][1]) for listed in entries}):
            if group not in seen:
                seen.add(group)
                groups.append(group)
    return groups

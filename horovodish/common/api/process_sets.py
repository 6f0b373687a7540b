"""Process sets: groups of ranks that run collectives among themselves.

Each set negotiates on its own: it has its own communicator, runtime thread, coordinator
(the set's lowest rank), response cache and queue, so sets make progress independently.
Creating and removing sets is collective over all ranks, as in Horovod (lifecycle.py).
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

    def __repr__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"

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

# What each rank proposes to a registration call: the call ("add_process_set" or
# "remove_process_set"), its rank list (add) or set id (remove), and a problem this rank
# found on its own (None if none), which every rank then raises.
Proposal = tuple[str, Any, "str | None"]


def disagreement(proposals: Sequence[Proposal]) -> str | None:
    """Why the ranks' proposals cannot go ahead together, or None if they can.

    An add may give every rank the same list, or give each rank a list it is in and its
    fellow members give too: disjoint groups (what ProcessSet(comm.Split(...)) gives),
    each registered under one id, as MPI_Comm_create allows."""
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
    if all(value == values[0] for value in values):
        return None
    if call == "add_process_set" and all(
            rank in value and all(values[member] == value for member in value)
            for rank, value in enumerate(values)):
        return None
    said = "; ".join(f"rank {rank}: {value}" for rank, value in enumerate(values))
    if call == "add_process_set":
        return (f"the ranks passed different rank lists ({said}); every rank passes the "
                "same list, or the group of ranks it belongs to, which each of them passes "
                "too.")
    return f"the ranks passed different process sets (ids: {said}); every rank passes the " \
           "same set."

"""A barrier for ranks on one host that counts in shared memory: what the shared-memory
exchanges of negotiation (negotiation/shm_exchange.py) and the shared-memory backend
(execution/backends/shm.py) meet on. A leaf both of them import downward."""
from __future__ import annotations

import os
import time
from typing import Sequence

import numpy as np
from mpi4py import MPI

from .peer_wait import Patience, wait_patiently

_LINE_WORDS = 8  # one 64-byte cache line per rank's counter: no false sharing
_ANNOUNCED = 1  # word of a rank's line: the meeting it has announced (see ``announce``)
_yield = getattr(os, "sched_yield", lambda: None)
# Polls of a blocking meeting before it starts to watch the clock (a few ms): patience
# costs nothing on the meetings that end in time.
_POLLS_BEFORE_PATIENCE = 4096


class CounterBarrier:
    """A barrier for ranks that share memory: each rank raises its counter to the
    meeting's number, and the meeting is over for a rank once every counter has reached
    that number. The surface of a persistent MPI request (Start, Test, Free), so the
    transport polls it like one.

    Why not MPI's persistent barrier: under MPICH each meeting took 2.3 us on 2 ranks,
    this 1.0 us (most of it the Python of a poll), and a small cycle meets once. Every
    rank meets in the same sequence (cycles are one sequence everywhere), so the numbers
    agree. A store of one aligned word is atomic; ``Win.Sync`` on either side orders it
    after this rank's writes to shared memory and before the reads that follow."""

    def __init__(self, node: MPI.Comm, patience: Patience | None = None,
                 names: Sequence[int] | None = None) -> None:
        """Collective over node (a communicator within one host). patience: how long
        ``meet`` waits for a rank that never comes (peer_wait.py; None: for ever);
        names: what messages call node's ranks (world ranks; default, node's own)."""
        rank, size = node.Get_rank(), node.Get_size()
        self._patience = patience
        self._names = list(names) if names is not None else list(range(size))
        self.pids: list[int] = node.allgather(os.getpid())  # to end a rank that froze
        self._window = MPI.Win.Allocate_shared(
            size * _LINE_WORDS * 8 if rank == 0 else 0, 8, comm=node)
        memory, _ = self._window.Shared_query(0)
        counters = np.frombuffer(memory, dtype=np.int64, count=size * _LINE_WORDS)
        if rank == 0:
            counters[:] = 0  # MPI leaves a new window's contents undefined
        self._window.Lock_all(MPI.MODE_NOCHECK)  # a passive epoch for Sync()
        node.Barrier()  # the zeros, before anyone counts
        self._counters = counters
        self._mine = rank * _LINE_WORDS
        self._others = [other * _LINE_WORDS for other in range(size) if other != rank]
        self._read = counters.item
        self._meeting = 0

    def Start(self) -> None:
        self._meeting += 1
        self._window.Sync()  # what this rank wrote, before its counter says it is here
        self._counters[self._mine] = self._meeting

    def Test(self) -> bool:
        read, meeting = self._read, self._meeting
        for index in self._others:
            if read(index) < meeting:
                return False
        self._window.Sync()  # the others' writes, seen after their counters
        return True

    def announce(self) -> None:
        """Say that this rank is on its way to its next meeting, before any collective
        work that comes first (a window that grows): a rank looking for peers that have
        begun a meeting (``peers_ahead``) sees it from here on, not only at Start."""
        self._counters[self._mine + _ANNOUNCED] = self._meeting + 1

    def peers_ahead(self) -> bool:
        """Whether some other rank has announced or started a meeting this rank has not
        started: two reads per rank of memory, no meeting of its own."""
        read, meeting = self._read, self._meeting
        for index in self._others:
            if read(index) > meeting or read(index + _ANNOUNCED) > meeting:
                return True
        return False

    def behind(self) -> list[int]:
        """The ranks (of node) that have not reached this rank's latest meeting."""
        read, meeting, line = self._read, self._meeting, _LINE_WORDS
        return [index // line for index in self._others if read(index) < meeting]

    def meet(self) -> None:
        """A whole meeting, blocking: polls, yielding the core in between, never sleeps
        (MPICH's own blocking barrier spins too). With patience, a rank that never comes
        is named, then ends the job (PeersNotAnswering)."""
        self.Start()
        test = self.Test
        for _ in range(_POLLS_BEFORE_PATIENCE):  # most meetings end within these
            if test():
                return
            _yield()
        if self._patience is None:
            while not test():
                _yield()
            return

        def a_while() -> bool:  # polls for up to a second
            until = time.monotonic() + 1.0
            while not test():
                _yield()
                if time.monotonic() > until:
                    return False
            return True
        wait_patiently(a_while, self._patience, self._names[self._mine // _LINE_WORDS],
                       lambda: [(self._names[r], self.pids[r]) for r in self.behind()],
                       "a shared-memory collective")

    def Free(self) -> None:
        self._window.Unlock_all()
        self._window.Free()

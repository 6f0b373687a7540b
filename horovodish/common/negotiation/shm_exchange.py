"""The exchanges within one host: every rank's [vector | region] through shared memory.

Each cycle's negotiation ANDs every rank's bit vector, and an eager cycle
(execution/piggyback.py) also gathers each rank's packed tensors to every rank. MPI
does both with messages: measured under MPICH on 2 ranks, from 64 KiB on its
allgather's handshakes made the cycle slower than negotiating and then reducing through
shared memory, and its persistent barrier alone took 2.3 us a meeting. Here each rank
writes its slot of a window every rank maps, then its counter (``CounterBarrier``, about
1 us a meeting); once every rank's counter has caught up, each rank reads every slot.
Exchanges take TURNS sets of slots in turn: a rank writes set t again only after the
meetings of the exchanges in between, which no rank passes before it has finished
reading set t.

Why four sets, not the two that safety needs: a rank that writes a line another core
has just read pays for taking it back (measured on this VM's AMD EPYC: 1 MiB took 75 us
against 24 us, and 450 us when the two vCPUs sit on different CCDs, which is when MPI
is slow too). Four sets give the other core time to drop the lines first: 1 MiB and
2 MiB eager cycles took 0.87-0.92x and 0.75-0.76x the time in such jobs, 1.02x and
1.07-1.10x in the others, and 64 KiB and 256 KiB were unchanged (docs/tuning.md).
"""
from __future__ import annotations

import logging
import os
import time
from typing import Callable, Sequence

import numpy as np
from mpi4py import MPI

from ..peer_wait import Patience, wait_patiently
from .transport import Pending

_CAPACITY_STEP = 64 << 10  # regions grow in these steps: a new window is collective
_FIRST_WORDS = 64  # bit-vector words the first window has room for (34 by default)
TURNS = 4  # sets of slots used in turn (see the module docstring)
_LINE_WORDS = 8  # one 64-byte cache line per rank's counter: no false sharing
_yield = getattr(os, "sched_yield", lambda: None)
# Polls of a blocking meeting before it starts to watch the clock (a few ms): patience
# costs nothing on the meetings that end in time.
_POLLS_BEFORE_PATIENCE = 4096
log = logging.getLogger("horovodish")


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


class ShmExchange:
    """One runtime's eager exchange within a host (made by ``open``)."""

    def __init__(self, node: MPI.Comm,
                 make_pending: Callable[[CounterBarrier, ShmExchange, int], Pending],
                 patience: Patience | None = None,
                 names: Sequence[int] | None = None) -> None:
        """make_pending(barrier, exchange, turn): the transport's pending exchange for
        each set of slots, done when the barrier's meeting is (collective over node).
        patience, names: the barrier's (CounterBarrier)."""
        self._node = node
        self.rank, self.size = node.Get_rank(), node.Get_size()
        barrier = self._barrier = CounterBarrier(node, patience, names)
        self._turns = TURNS  # sets of slots, used in turn
        self._pending = [make_pending(barrier, self, turn) for turn in range(TURNS)]
        self._window: MPI.Win | None = None
        self._slots: np.ndarray | None = None  # (turn, rank, words) uint64
        self._shape = (0, 0)  # (vector words, region bytes) of the slots' layout
        self._layouts: dict[tuple[int, int], tuple] = {}  # views by (words, bytes)
        self._width = 0  # words a slot holds
        self._turn = 0
        # Every cycle meets here from the first, so the window is made now, where a
        # failure can still fall back to MPI (``open``); it grows later if a region needs.
        self._allocate(_FIRST_WORDS, _CAPACITY_STEP)

    @classmethod
    def open(cls, comm: MPI.Comm,
             make_pending: Callable[[CounterBarrier, ShmExchange, int], Pending],
             patience: Patience | None = None, names: Sequence[int] | None = None
             ) -> ShmExchange | None:
        """Collective over comm: an exchange if every rank shares one host and could map
        the windows, else None (then negotiation goes through MPI)."""
        node = comm.Split_type(MPI.COMM_TYPE_SHARED)
        exchange, error = None, ""
        if node.Get_size() == comm.Get_size():
            try:
                exchange = cls(node, make_pending, patience, names)
            except MPI.Exception as exc:  # a small /dev/shm, say
                error = str(exc)
        if not comm.allreduce(exchange is not None, op=MPI.LAND):
            if exchange is not None:
                exchange.close()
            else:
                node.Free()
            if error:
                log.warning("shared-memory negotiation unavailable (%s); using MPI", error)
            return None
        return exchange

    def region(self, words: int, nbytes: int) -> np.ndarray:
        """This rank's region in the next exchange's set of slots (takes the next turn)."""
        if (words, nbytes) != self._shape:
            self._layout(words, nbytes)
        turn = self._turn = (self._turn + 1) % self._turns
        return self._regions[turn]

    def start(self, vector: np.ndarray) -> Pending:
        turn = self._turn
        self._mine[turn][:vector.size] = vector
        self._window.Sync()  # this rank's writes before the barrier
        self._barrier.Start()
        return self._pending[turn]

    def result(self, turn: int) -> np.ndarray:
        """After the barrier: every rank's vector, ANDed."""
        self._window.Sync()  # every rank's writes, seen after the barrier
        vectors = self._vectors[turn]
        if self.size == 2:  # a third of the reduce's cost, in the common case
            return np.bitwise_and(vectors[0], vectors[1])
        return np.bitwise_and.reduce(vectors, axis=0)

    def rows(self, turn: int) -> list[np.ndarray]:
        return self._rows[turn]

    def meet(self) -> None:
        """A blocking meeting, with this rank's writes visible before and everyone's
        after (split plans: each rank's reduced slice, then the copies out)."""
        window = self._window
        window.Sync()
        self._barrier.meet()
        window.Sync()

    def _layout(self, words: int, nbytes: int) -> None:
        """Views for this layout, in a window large enough (a new one is collective:
        every rank reaches here at the same cycle, the plan being agreed). Layouts met
        before are kept: plans that take turns have a region size each."""
        if self._window is None or words + -(-nbytes // 8) > self._width:
            self._allocate(words, -(-max(nbytes, 1) // _CAPACITY_STEP) * _CAPACITY_STEP)
        layout = self._layouts.get((words, nbytes))
        if layout is None:
            if len(self._layouts) >= 16:
                self._layouts.clear()
            slots = self._slots
            turns = range(TURNS)
            rows = [[slots[turn, rank, words:].view(np.uint8)[:nbytes]
                     for rank in range(self.size)] for turn in turns]
            layout = self._layouts[(words, nbytes)] = (
                [slots[turn, self.rank] for turn in turns],
                [slots[turn, :, :words] for turn in turns], rows,
                [turn_rows[self.rank] for turn_rows in rows])
        self._mine, self._vectors, self._rows, self._regions = layout
        self._shape = (words, nbytes)

    def _allocate(self, words: int, capacity: int) -> None:
        """A window whose slots hold words and then capacity bytes (collective)."""
        self.close_window()
        width = words + capacity // 8
        nbytes = TURNS * self.size * width * 8
        # Rank 0 holds the whole window, so it is one array: (turn, rank, words).
        window = MPI.Win.Allocate_shared(nbytes if self.rank == 0 else 0, 8, comm=self._node)
        memory, _ = window.Shared_query(0)
        self._slots = np.frombuffer(memory, dtype=np.uint64,
                                    count=nbytes // 8).reshape(TURNS, self.size, width)
        window.Lock_all(MPI.MODE_NOCHECK)  # a passive epoch for Sync(): memory barriers
        self._window, self._width = window, width

    def close_window(self) -> None:
        if self._window is not None:
            self._slots = None
            self._mine = self._vectors = self._rows = self._regions = []
            self._layouts = {}
            self._window.Unlock_all()
            self._window.Free()
            self._window = None
            self._shape = (0, 0)

    def close(self) -> None:
        self.close_window()
        self._barrier.Free()
        self._node.Free()

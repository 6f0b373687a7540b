"""The exchanges within one host: every rank's [vector | region] through shared memory.

Each cycle's negotiation ANDs every rank's bit vector, and an eager cycle
(execution/piggyback.py) also gathers each rank's packed tensors to every rank. MPI
does both with messages: measured under MPICH on 2 ranks, from 64 KiB on its
allgather's handshakes made the cycle slower than negotiating and then reducing through
shared memory, and its persistent barrier alone took 2.3 us a meeting. Here each rank
writes its slot of a window every rank maps, then its counter (``CounterBarrier`` of
shm_barrier.py, about
1 us a meeting); once every rank's counter has caught up, each rank reads every slot.
Exchanges take TURNS sets of slots in turn: a rank writes set t again only after the
meetings of the exchanges in between, which no rank passes before it has finished
reading set t.

Why four sets, not the two that safety needs: a rank that writes a line another core
has just read pays for taking it back (measured on a 2-core AMD EPYC machine: 1 MiB
took 75 us against 24 us, and 450 us when the two vCPUs sit on different CCDs, which is
when MPI is slow too). Four sets give the other core time to drop the lines first: 1 MiB and
2 MiB eager cycles took 0.87-0.92x and 0.75-0.76x the time in such jobs, 1.02x and
1.07-1.10x in the others, and 64 KiB and 256 KiB were unchanged (docs/tuning.md).
"""
from __future__ import annotations

import logging
from typing import Callable, Sequence

import numpy as np
from mpi4py import MPI

from ..peer_wait import Patience
from ..shm_barrier import CounterBarrier
from .transport import Pending

_CAPACITY_STEP = 64 << 10  # regions grow in these steps: a new window is collective
_FIRST_WORDS = 64  # bit-vector words the first window has room for (34 by default)
TURNS = 4  # sets of slots used in turn (see the module docstring)
log = logging.getLogger("horovodish")


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
        """This rank's region in the next exchange's set of slots (takes the next turn).
        Every exchange begins here, so this is where it is announced (``peers_started``)."""
        self._barrier.announce()
        if (words, nbytes) != self._shape:
            self._layout(words, nbytes)
        turn = self._turn = (self._turn + 1) % self._turns
        return self._regions[turn]

    def capacity(self, words: int) -> int:
        """Region bytes a slot holds beside a vector of that many words as it is: any
        rank may take a region up to this on its own (``region`` grows the window, a
        collective, only beyond it)."""
        return max(0, (self._width - words) * 8)

    def peers_started(self) -> bool:
        """Whether another rank has begun an exchange (a cycle) this rank has not: what
        an idle rank joins rather than leads (runtime/thread.py)."""
        return self._barrier.peers_ahead()

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

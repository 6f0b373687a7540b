"""The eager exchange within one host: every rank's [vector | region] through shared memory.

An eager cycle (execution/eager.py) gathers each rank's bit vector and packed tensors to
every rank. MPI's allgather does that with messages: measured under MPICH on 2 ranks,
from 64 KiB on its handshakes made the cycle slower than negotiating and then reducing
through shared memory. Here each rank writes its slot of a window every rank maps, and
one non-blocking barrier (polled, like the negotiation allreduce) is the whole meeting;
then each rank reads every slot. Slots alternate between two halves from one exchange to
the next: a rank writes half h again only after the barrier of the exchange in between,
which no rank passes before it has finished reading half h.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from .transport import Pending

_CAPACITY_STEP = 64 << 10  # regions grow in these steps: a new window is collective


class ShmExchange:
    """One runtime's eager exchange within a host (made by ``open``)."""

    def __init__(self, node: MPI.Comm, barrier: Any,
                 make_pending: Callable[[Any, ShmExchange, int], Pending]) -> None:
        """barrier: a persistent barrier on node (Start, Test, Free); make_pending(barrier,
        exchange, half): the transport's pending exchange for each half."""
        self._node = node
        self.rank, self.size = node.Get_rank(), node.Get_size()
        self._barrier = barrier
        self._pending = [make_pending(barrier, self, half) for half in (0, 1)]
        self._window: MPI.Win | None = None
        self._slots: np.ndarray | None = None  # (half, rank, words) uint64
        self._shape = (0, 0)  # (vector words, region bytes) of the slots' layout
        self._capacity = 0  # region bytes the window holds per slot
        self._layouts: dict[tuple[int, int], tuple] = {}  # views by (words, bytes)
        self._half = 0

    @classmethod
    def open(cls, comm: MPI.Comm, make_barrier: Callable[[MPI.Comm], Any],
             make_pending: Callable[[Any, ShmExchange, int], Pending]
             ) -> ShmExchange | None:
        """Collective over comm: an exchange if every rank shares one host, else None."""
        node = comm.Split_type(MPI.COMM_TYPE_SHARED)
        if not comm.allreduce(node.Get_size() == comm.Get_size(), op=MPI.LAND):
            node.Free()
            return None
        return cls(node, make_barrier(node), make_pending)

    def region(self, words: int, nbytes: int) -> np.ndarray:
        """This rank's region in the next exchange's half (flips the half)."""
        if (words, nbytes) != self._shape:
            self._layout(words, nbytes)
        self._half ^= 1
        return self._regions[self._half]

    def start(self, vector: np.ndarray) -> Pending:
        half = self._half
        self._mine[half][:vector.size] = vector
        self._window.Sync()  # this rank's writes before the barrier
        self._barrier.Start()
        return self._pending[half]

    def result(self, half: int) -> np.ndarray:
        """After the barrier: every rank's vector, ANDed."""
        self._window.Sync()  # every rank's writes, seen after the barrier
        vectors = self._vectors[half]
        if self.size == 2:  # a third of the reduce's cost, in the common case
            return np.bitwise_and(vectors[0], vectors[1])
        return np.bitwise_and.reduce(vectors, axis=0)

    def rows(self, half: int) -> list[np.ndarray]:
        return self._rows[half]

    def meet(self) -> None:
        """A blocking barrier, with this rank's writes visible before and everyone's
        after (split plans: each rank's reduced slice, then the copies out)."""
        window = self._window
        window.Sync()
        self._node.Barrier()
        window.Sync()

    def _layout(self, words: int, nbytes: int) -> None:
        """Views for this layout, in a window large enough (a new one is collective:
        every rank reaches here at the same cycle, the plan being agreed). Layouts met
        before are kept: plans that take turns have a region size each."""
        if nbytes > self._capacity or self._window is None:
            self._allocate(words, -(-max(nbytes, 1) // _CAPACITY_STEP) * _CAPACITY_STEP)
        layout = self._layouts.get((words, nbytes))
        if layout is None:
            if len(self._layouts) >= 16:
                self._layouts.clear()
            slots = self._slots
            rows = [[slots[half, rank, words:].view(np.uint8)[:nbytes]
                     for rank in range(self.size)] for half in (0, 1)]
            layout = self._layouts[(words, nbytes)] = (
                [slots[half, self.rank] for half in (0, 1)],
                [slots[half, :, :words] for half in (0, 1)], rows,
                [half_rows[self.rank] for half_rows in rows])
        self._mine, self._vectors, self._rows, self._regions = layout
        self._shape = (words, nbytes)

    def _allocate(self, words: int, capacity: int) -> None:
        self.close_window()
        width = words + capacity // 8
        nbytes = 2 * self.size * width * 8
        # Rank 0 holds the whole window, so it is one array: (half, rank, words).
        window = MPI.Win.Allocate_shared(nbytes if self.rank == 0 else 0, 8, comm=self._node)
        memory, _ = window.Shared_query(0)
        self._slots = np.frombuffer(memory, dtype=np.uint64,
                                    count=nbytes // 8).reshape(2, self.size, width)
        window.Lock_all(MPI.MODE_NOCHECK)  # a passive epoch for Sync(): memory barriers
        self._window, self._capacity = window, capacity

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

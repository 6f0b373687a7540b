"""Negotiation over MPI without burning a core while waiting.

MPICH's blocking calls busy-poll, so a rank waiting for a slow peer would steal a CPU
from the training thread. The bit-vector allreduce is a persistent collective, started
each cycle and polled: on the runtime thread a short spin for latency, then sleeps that
grow with the wait; on a caller that drives the cycle (blocked anyway, for at most its
2 ms hand-over limit), polls with sched_yield in between, since one sleep costs more
than most such waits on a small VM.

When every rank shares one host, both the bit vectors and eager regions go through shared
memory instead (shm_exchange.py): polled the same way, with no MPI call per cycle.
"""
from __future__ import annotations

import os
import time
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from ..peer_wait import Patience
from .shm_exchange import ShmExchange
from .request_records import GatheredRecords
from .transport import Pending, Transport

_SPIN_SECONDS = 50e-6
_MAX_SLEEP = 1e-3
_yield = getattr(os, "sched_yield", lambda: None)


def wait_politely(request: MPI.Request, max_sleep: float = _MAX_SLEEP,
                  deadline: float | None = None, patience: float | None = None) -> bool:
    """Wait for a non-blocking MPI request, sleeping rather than spinning when it is slow;
    False if time.monotonic() passed deadline first, or patience seconds passed.

    With a deadline the waiter is a caller blocked anyway, for at most that long (a
    couple of ms): it polls without sleeping, since one sleep on a small VM costs more
    than most such waits (docs/tuning.md), and yields the core between polls in case a peer rank shares it."""
    if deadline is not None:
        test, now = request.Test, time.monotonic
        while not test():
            if now() > deadline:
                return False
            _yield()
        return True
    start = time.perf_counter()
    while not request.Test():
        waited = time.perf_counter() - start
        if patience is not None and waited > patience:
            return False
        if waited > _SPIN_SECONDS:
            time.sleep(min(max(waited / 16, 20e-6), max_sleep))
    return True


class _Reposted:
    """A persistent collective's surface (Start, Test, Free) over its non-blocking form,
    for MPIs without MPI-4's persistent collectives: Open MPI 4.x raises
    NotImplementedError at Allreduce_init. Posting costs a little more per cycle;
    nothing else changes."""

    def __init__(self, post: Callable[[], MPI.Request]) -> None:
        self._post = post
        self._request = MPI.REQUEST_NULL

    def Start(self) -> None:
        self._request = self._post()

    def Test(self) -> bool:
        return self._request.Test()

    def Free(self) -> None:
        """Nothing to free: each request ends with its Test (one in flight at a time)."""


class _MPIPending(Pending):
    def __init__(self, request: MPI.Request, out: np.ndarray, transport: MPITransport,
                 rows: list[np.ndarray] | None = None) -> None:
        super().__init__(out, rows)
        self._request = request
        self._transport = transport

    def wait(self, deadline: float | None = None, patience: float | None = None) -> bool:
        return wait_politely(self._request, self._transport.max_sleep, deadline, patience)


class _GatherPending(_MPIPending):
    """Every rank's [vector | region] gathered: the result is the vectors' AND."""

    def __init__(self, request: MPI.Request, received: np.ndarray, words: int,
                 transport: MPITransport, rows: list[np.ndarray]) -> None:
        super().__init__(request, received, transport, rows)
        self._vectors = received[:, :words]

    def result(self) -> np.ndarray:
        return np.bitwise_and.reduce(self._vectors, axis=0)


class _ShmPending(_MPIPending):
    """An exchange through shared memory (shm_exchange.py): done when its barrier is."""

    def __init__(self, request: Any, exchange: ShmExchange, turn: int,
                 transport: MPITransport) -> None:
        super().__init__(request, None, transport)
        self._exchange, self._turn = exchange, turn

    def result(self) -> np.ndarray:
        return self._exchange.result(self._turn)

    def rows(self) -> list[np.ndarray]:
        return self._exchange.rows(self._turn)

    def meet(self) -> None:
        self._exchange.meet()

    def missing(self) -> list[tuple[int, int]] | None:
        """The ranks whose counters have not reached this exchange's meeting (the node
        holds every rank of the transport, in its order: ShmExchange.open)."""
        return [(rank, self._request.pids[rank]) for rank in self._request.behind()]


class MPITransport(Transport):
    def __init__(self, comm: MPI.Comm, patience: Patience | None = None,
                 world_ranks: list[int] | None = None) -> None:
        """patience, world_ranks: for the shared-memory exchange's blocking meetings
        (peer_wait.py; what messages call comm's ranks)."""
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self._records_buffer: np.ndarray | None = None  # rank 0's, see gather_records
        # The runtime raises this while it has nothing pending: noticing a finished idle
        # negotiation a few ms late costs nothing, and every poll takes the GIL from the
        # training thread.
        self.max_sleep = _MAX_SLEEP
        # The negotiation allreduce as an MPI persistent collective (created on first use;
        # every cycle sends a vector of the same length): Start costs a fraction of posting
        # an Iallreduce, and no buffers or requests are made per cycle. One
        # negotiation is in flight at a time, so its buffers are reused.
        self._send: np.ndarray | None = None
        self._recv: np.ndarray | None = None
        self._persistent: MPI.Prequest | _Reposted | None = None
        self._pending: _MPIPending | None = None
        # The same for cycles whose small allreduces ride along (start_gather_and): a
        # persistent allgather of [vector | region], reopened when either size changes.
        self._gather_shape = (0, 0)
        self._gather_send: np.ndarray | None = None
        self._gather_region: np.ndarray | None = None
        self._gather: MPI.Prequest | _Reposted | None = None
        self._gather_pending: _GatherPending | None = None
        # Within one host both exchanges go through shared memory instead (collective:
        # every rank's transport is made at the same point of init).
        self._shm: ShmExchange | None = ShmExchange.open(
            comm, lambda barrier, exchange, turn: _ShmPending(barrier, exchange, turn, self),
            patience, world_ranks) if self.size > 1 else None
        # Without persistent collectives (MPI before 4.0: Open MPI 4.x) each cycle posts an
        # Iallreduce, which must then keep one order with the backends' collectives on
        # comm on every rank; it runs on a communicator of its own instead (measured on
        # Open MPI 4.1: on the shared one, messages of different collectives met and
        # were truncated).
        self._own_comm: MPI.Comm | None = comm.Dup() if self.size > 1 and \
            MPI.Get_version() < (4, 0) else None

    def allreduce_and(self, words: np.ndarray) -> np.ndarray:
        pending = self.start_allreduce_and(words)
        pending.wait()
        return pending.result().copy()

    def start_allreduce_and(self, words: np.ndarray) -> Pending:
        """The result is valid until the next call (the controller decodes it at once)."""
        if self.size == 1:
            return Pending(words)
        if self._shm is not None:  # one host: a slot each and a meeting, no messages
            self._shm.region(words.size, 0)
            return self._shm.start(words)
        if self._persistent is None or self._send.shape != words.shape:
            self._open(words.shape)
        np.copyto(self._send, words)
        self._persistent.Start()
        return self._pending

    def _open(self, shape: tuple[int, ...]) -> None:
        self._release()
        self._send = np.empty(shape, dtype=np.uint64)
        self._recv = np.empty(shape, dtype=np.uint64)
        if self._own_comm is None:
            try:
                self._persistent = self.comm.Allreduce_init(self._send, self._recv,
                                                            op=MPI.BAND)
            except NotImplementedError:  # MPI 4.0 in name, without the call
                self._own_comm = self.comm.Dup()
        if self._own_comm is not None:
            own, send, recv = self._own_comm, self._send, self._recv
            self._persistent = _Reposted(lambda: own.Iallreduce(send, recv, op=MPI.BAND))
        self._pending = _MPIPending(self._persistent, self._recv, self)

    @property
    def one_host(self) -> bool:
        """Whether eager exchanges go through shared memory (every rank on one host)."""
        return self._shm is not None

    def region(self, words: int, nbytes: int) -> np.ndarray:
        """The region sits in the send buffer right after the vector: filled in place."""
        if self._shm is not None:
            return self._shm.region(words, nbytes)
        if self._gather is None or self._gather_shape != (words, nbytes):
            self._open_gather(words, nbytes)
        return self._gather_region

    def region_capacity(self, words: int) -> int:
        return self._shm.capacity(words) if self._shm is not None else 0

    def peers_started(self) -> bool | None:
        if self.size == 1:
            return False
        return self._shm.peers_started() if self._shm is not None else None

    def start_gather_and(self, words: np.ndarray) -> Pending:
        if self._shm is not None:
            return self._shm.start(words)
        send = self._gather_send
        send[:words.size] = words
        if self.size == 1:
            return Pending(words, [self._gather_region])
        self._gather.Start()
        return self._gather_pending

    def _open_gather(self, words: int, nbytes: int) -> None:
        self._release_gather()
        width = words + (nbytes + 7) // 8  # region rounded up to whole words
        send = self._gather_send = np.zeros(width, dtype=np.uint64)
        received = np.zeros((self.size, width), dtype=np.uint64)
        self._gather_region = send[words:].view(np.uint8)[:nbytes]
        rows = [received[rank, words:].view(np.uint8)[:nbytes] for rank in range(self.size)]
        self._gather_shape = (words, nbytes)
        if self.size == 1:
            self._gather = _Reposted(lambda: MPI.REQUEST_NULL)
            return
        if self._own_comm is None:
            try:
                self._gather = self.comm.Allgather_init(send, received)
            except NotImplementedError:  # MPI 4.0 in name, without the call
                self._own_comm = self.comm.Dup()
        if self._own_comm is not None:
            own = self._own_comm
            self._gather = _Reposted(lambda: own.Iallgather(send, received))
        self._gather_pending = _GatherPending(self._gather, received, words, self, rows)

    def _release(self) -> None:
        if self._persistent is not None:
            self._persistent.Free()
            self._persistent = self._pending = None
        self._release_gather()

    def _release_gather(self) -> None:
        if self._gather is not None:
            self._gather.Free()
            self._gather = self._gather_pending = None

    def release_shared(self) -> None:
        """Free the shared-memory window (collective: at a negotiated shutdown only; a
        runtime that failed leaves it to the process's end, as a peer may be gone)."""
        if self._shm is not None:
            shm, self._shm = self._shm, None
            shm.close()

    def close(self) -> None:
        """Free the persistent request and the transport's own communicator, if any
        (before comm is freed)."""
        self._release()
        if self._own_comm is not None:
            own, self._own_comm = self._own_comm, None
            try:
                own.Free()
            except MPI.Exception:  # a peer that died can leave it unfreeable: leave it
                pass

    def gather(self, obj: Any) -> list[Any] | None:
        return self.comm.gather(obj, root=0)

    def bcast(self, obj: Any) -> Any:
        return self.comm.bcast(obj, root=0)

    def allgather_ints(self, values: np.ndarray) -> np.ndarray:
        mine = np.ascontiguousarray(values, dtype=np.int64)
        rows = np.empty((self.size, len(mine)), dtype=np.int64)
        self.comm.Allgather(mine, rows)
        return rows

    def gather_records(self, record: bytes) -> GatheredRecords | None:
        """The records' lengths, then the records into one buffer at rank 0 (what a
        pickled gather does too, less the unpickling of every rank's object)."""
        mine = np.frombuffer(record, dtype=np.uint8)
        root = self.rank == 0
        lengths = np.empty(self.comm.Get_size(), dtype=np.int64) if root else None
        self.comm.Gather(np.array([len(record)], dtype=np.int64), lengths, root=0)
        if not root:
            self.comm.Gatherv(mine, None, root=0)
            return None
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        total = int(offsets[-1])
        # One receive buffer, grown as needed: a fresh one of tens of MB (thousands of
        # ranks' records) would cost rank 0 its page faults every slow cycle.
        held = self._records_buffer
        if held is None or held.size < total:
            held = self._records_buffer = np.empty(total + total // 4, dtype=np.uint8)
        buffer = held[:total]
        self.comm.Gatherv(mine, [buffer, lengths, offsets[:-1], MPI.BYTE], root=0)
        return GatheredRecords(buffer, offsets)

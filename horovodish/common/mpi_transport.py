"""Negotiation over MPI without burning a core while waiting.

MPICH's blocking calls busy-poll, so a rank waiting for a slow peer would steal a CPU
from the training thread. The bit-vector allreduce is posted non-blocking and polled:
a short spin for latency, then sleeps that grow with the wait.
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np
from mpi4py import MPI

from .controller import Pending, Transport

_SPIN_SECONDS = 50e-6
_MAX_SLEEP = 1e-3


def wait_politely(request: MPI.Request, max_sleep: float = _MAX_SLEEP,
                  deadline: float | None = None) -> bool:
    """Wait for a non-blocking MPI request, sleeping rather than spinning when it is slow;
    False if perf_counter() passed deadline first."""
    start = time.perf_counter()
    while not request.Test():
        now = time.perf_counter()
        if deadline is not None and now > deadline:
            return False
        waited = now - start
        if waited > _SPIN_SECONDS:
            time.sleep(min(max(waited / 16, 20e-6), max_sleep))
    return True


class _MPIPending(Pending):
    def __init__(self, request: MPI.Request, words: np.ndarray, out: np.ndarray,
                 max_sleep: float) -> None:
        super().__init__(out)
        self._request = request
        self._words = words  # MPI reads it until the request completes
        self._max_sleep = max_sleep

    def wait(self, deadline: float | None = None) -> bool:
        return wait_politely(self._request, self._max_sleep, deadline)


class MPITransport(Transport):
    def __init__(self, comm: MPI.Comm) -> None:
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        # The runtime raises this while it has nothing pending: noticing a finished idle
        # negotiation a few ms late costs nothing, and every poll takes the GIL from the
        # training thread.
        self.max_sleep = _MAX_SLEEP

    def allreduce_and(self, words: np.ndarray) -> np.ndarray:
        pending = self.start_allreduce_and(words)
        pending.wait()
        return pending.result()

    def start_allreduce_and(self, words: np.ndarray) -> Pending:
        if self.size == 1:
            return Pending(words)
        out = np.empty_like(words)
        return _MPIPending(self.comm.Iallreduce(words, out, op=MPI.BAND), words, out,
                           self.max_sleep)

    def gather(self, obj: Any) -> list[Any] | None:
        return self.comm.gather(obj, root=0)

    def bcast(self, obj: Any) -> Any:
        return self.comm.bcast(obj, root=0)

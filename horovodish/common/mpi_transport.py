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

from .controller import Transport

_SPIN_SECONDS = 50e-6
_MAX_SLEEP = 1e-3


def wait_politely(request: MPI.Request, max_sleep: float = _MAX_SLEEP) -> None:
    """Wait for a non-blocking MPI request, sleeping rather than spinning when it is slow."""
    start = time.perf_counter()
    while not request.Test():
        waited = time.perf_counter() - start
        if waited > _SPIN_SECONDS:
            time.sleep(min(max(waited / 16, 20e-6), max_sleep))


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
        if self.size == 1:
            return words
        out = np.empty_like(words)
        wait_politely(self.comm.Iallreduce(words, out, op=MPI.BAND), self.max_sleep)
        return out

    def gather(self, obj: Any) -> list[Any] | None:
        return self.comm.gather(obj, root=0)

    def bcast(self, obj: Any) -> Any:
        return self.comm.bcast(obj, root=0)

"""What negotiation needs from the network: a bitwise-AND allreduce, a gather at the
coordinator and a broadcast from it. MPI in production (mpi_transport.py), a fake
world in the unit tests, so the controller runs in one process there.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np


class Pending:
    """A bitwise-AND allreduce in flight (``Transport.start_allreduce_and``)."""

    def __init__(self, result: np.ndarray) -> None:
        self._result = result

    def wait(self, deadline: float | None = None) -> bool:
        """Block until it is done (True), or until time.monotonic() passes deadline (False)."""
        return True

    def result(self) -> np.ndarray:
        return self._result


class Transport(ABC):
    """The three collectives negotiation needs; MPI in production, a fake in tests."""

    rank: int
    size: int

    @abstractmethod
    def allreduce_and(self, words: np.ndarray) -> np.ndarray:
        """Bitwise AND of uint64 words across ranks."""

    def start_allreduce_and(self, words: np.ndarray) -> Pending:
        """allreduce_and without waiting for it; this default waits (fakes, one rank)."""
        return Pending(self.allreduce_and(words))

    @abstractmethod
    def gather(self, obj: Any) -> list[Any] | None:
        """Every rank's obj at the coordinator (rank 0), None elsewhere."""

    @abstractmethod
    def bcast(self, obj: Any) -> Any:
        """The coordinator's obj on every rank."""

    def close(self) -> None:
        """Release what the transport holds (the runtime thread calls it as it exits)."""

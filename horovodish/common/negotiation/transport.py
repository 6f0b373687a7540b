"""What negotiation needs from the network: a bitwise-AND allreduce, a gather at the
coordinator (of objects, and of every rank's request record as bytes) and a
broadcast from it; and, for cycles that carry small allreduces with
their negotiation (execution/piggyback.py), the same AND with every rank's bytes gathered
alongside. MPI in production (mpi_transport.py), a fake world in the unit tests, so the
controller runs in one process there.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from .request_records import GatheredRecords


class Pending:
    """A bitwise-AND allreduce in flight (``Transport.start_allreduce_and``)."""

    def __init__(self, result: np.ndarray, rows: list[np.ndarray] | None = None) -> None:
        self._result = result
        self._rows = rows

    def wait(self, deadline: float | None = None, patience: float | None = None) -> bool:
        """Block until it is done (True), or until time.monotonic() passes deadline
        (False; polling without sleeping, for a caller that waits a few ms at most), or
        until patience seconds have passed (False; sleeping between polls as without)."""
        return True

    def missing(self) -> list[tuple[int, int]] | None:
        """(rank of the transport, process id on this host) of each rank known not to
        have taken part yet; None where the exchange cannot tell (an MPI collective)."""
        return None

    def result(self) -> np.ndarray:
        return self._result

    def rows(self) -> list[np.ndarray]:
        """Every rank's region, in rank order (``Transport.start_gather_and`` only)."""
        assert self._rows is not None
        return self._rows

    def meet(self) -> None:
        """After a gather through shared memory: a barrier of its ranks, once each has
        written into its own region what the others are to read (split eager plans,
        planned only where the exchange is through shared memory)."""
        raise NotImplementedError("only an exchange through shared memory meets again")


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

    def gather_records(self, record: bytes) -> GatheredRecords | None:
        """Every rank's request record (request_records.py) at the coordinator, as one
        buffer; None elsewhere. This default rides on gather (fakes)."""
        records = self.gather(record)
        return None if records is None else GatheredRecords.of(records)

    def allgather_ints(self, values: np.ndarray) -> np.ndarray:
        """Every rank's int64 vector (the same length on every rank), as rows in rank
        order, on every rank. This default rides on gather and bcast (fakes)."""
        gathered = self.gather(np.asarray(values, dtype=np.int64).copy())
        return self.bcast(None if gathered is None else np.stack(gathered))

    def region(self, words: int, nbytes: int) -> np.ndarray:
        """This rank's region (uint8) for the next ``start_gather_and`` of a vector of
        that many words: fill it, then start. Valid until the next call."""
        region = getattr(self, "_region", None)
        if region is None or region.size != nbytes:
            region = self._region = np.zeros(nbytes, dtype=np.uint8)
        return region

    def region_capacity(self, words: int) -> int:
        """Bytes a region beside a vector of that many words may take without the
        exchange growing (which would be collective), where a rank may bring one while
        another does not (start_gather_and and start_allreduce_and then being one
        exchange, as through shared memory); 0 where every rank must ask for the same
        size (an MPI allgather), as for these defaults."""
        return 0

    def start_gather_and(self, words: np.ndarray) -> Pending:
        """start_allreduce_and(words), with every rank's region (``region``) gathered to
        every rank on the way. This default rides on gather and bcast (fakes)."""
        gathered = self.bcast(self.gather((words.copy(), self._region.copy())))
        anded = gathered[0][0].copy()
        for vector, _ in gathered[1:]:
            anded &= vector
        return Pending(anded, [row for _, row in gathered])

    def peers_started(self) -> bool | None:
        """Whether another rank has begun a negotiation this rank has not; None where the
        transport cannot tell without taking part (an MPI collective, these defaults):
        then an idle rank negotiates every idle period whether or not anyone has work."""
        return None

    def close(self) -> None:
        """Release what the transport holds (the runtime thread calls it as it exits)."""

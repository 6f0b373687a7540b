"""N controllers in one process, each on its own thread, joined by an in-memory transport."""
from __future__ import annotations

import threading
from typing import Any

import numpy as np

from horovodish.common.negotiation.controller import Controller, CycleResult
from horovodish.common.negotiation.transport import Transport
from horovodish.common.messages import Request
from horovodish.common.stall import StallInspector


class _Exchange:
    def __init__(self, size: int) -> None:
        self.size = size
        self.barrier = threading.Barrier(size)
        self.slots: list[Any] = [None] * size
        self.calls = {"allreduce_and": 0, "gather": 0, "bcast": 0}

    def everyone(self, rank: int, value: Any) -> list[Any]:
        self.slots[rank] = value
        self.barrier.wait()
        values = list(self.slots)
        self.barrier.wait()
        return values


class FakeTransport(Transport):
    def __init__(self, exchange: _Exchange, rank: int) -> None:
        self.exchange = exchange
        self.rank = rank
        self.size = exchange.size

    def allreduce_and(self, words: np.ndarray) -> np.ndarray:
        if self.rank == 0:
            self.exchange.calls["allreduce_and"] += 1
        values = self.exchange.everyone(self.rank, words.copy())
        out = values[0].copy()
        for value in values[1:]:
            out &= value
        return out

    def gather(self, obj: Any) -> list[Any] | None:
        if self.rank == 0:
            self.exchange.calls["gather"] += 1
        values = self.exchange.everyone(self.rank, obj)
        return values if self.rank == 0 else None

    def bcast(self, obj: Any) -> Any:
        if self.rank == 0:
            self.exchange.calls["bcast"] += 1
        return self.exchange.everyone(self.rank, obj)[0]


class FakeWorld:
    """Runs one negotiation cycle on every rank at once."""

    def __init__(self, size: int, cache_capacity: int = 16, stall_check: float | None = None,
                 stall_shutdown: float = 0.0, clock=None, world_ranks=None) -> None:
        self.exchange = _Exchange(size)
        self.size = size
        kwargs = {} if clock is None else {"clock": clock}
        self.controllers = []
        for rank in range(size):
            stall = None
            if stall_check is not None and rank == 0:
                stall = StallInspector(size, stall_check, stall_shutdown,
                                       world_ranks=world_ranks, **kwargs)
            self.controllers.append(Controller(FakeTransport(self.exchange, rank), cache_capacity,
                                               stall, world_ranks=world_ranks, **kwargs))

    def cycle(self, requests: dict[int, list[Request]] | None = None,
              shutdown: set[int] = frozenset()) -> list[CycleResult]:
        requests = requests or {}
        results: list[CycleResult | None] = [None] * self.size
        errors: list[BaseException] = []

        def run(rank: int) -> None:
            try:
                results[rank] = self.controllers[rank].cycle(requests.get(rank, []),
                                                             rank in shutdown)
            except BaseException as exc:  # surfaced below
                errors.append(exc)
                self.exchange.barrier.abort()

        threads = [threading.Thread(target=run, args=(r,)) for r in range(self.size)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        if errors:
            raise errors[0]
        return results  # type: ignore[return-value]

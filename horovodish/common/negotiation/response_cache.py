"""LRU cache of negotiated responses with bit positions identical on every rank.

Every rank inserts, touches and evicts in the same order (the order responses execute),
so a cached response has the same bit everywhere. In steady state a rank only says
"bits i, j, k are ready" and one bitwise-AND allreduce finds what all ranks have.
"""
from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

from ..messages import Request, Response


@dataclass(slots=True)
class CachedResponse:
    response: Response
    signature: Request | None  # this rank's request that produced it (None: rank had joined)
    bit: int
    mask: int = 0  # 1 << bit, computed once: the controller ORs it per tensor per cycle

    def __post_init__(self) -> None:
        self.mask = 1 << self.bit


class ResponseCache:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._by_name: OrderedDict[str, CachedResponse] = OrderedDict()
        self._by_bit: dict[int, CachedResponse] = {}
        self._free_bits: list[int] = list(range(capacity))  # smallest free bit first
        # Bumped by every insertion and removal: equal versions mean the same entries
        # with the same signatures at the same bits (the controller's replay tests it).
        self.version = 0
        # The last take_entries: its list, its responses and the version it saw.
        self._last_take: tuple[list[CachedResponse], list[Response], int] | None = None
        # cached_as(name): the entry for a name, or None. The dict's own get: this is the
        # controller's per-tensor test, and a method around it would double its cost.
        self.cached_as: Callable[[str], CachedResponse | None] = self._by_name.get

    def __len__(self) -> int:
        return len(self._by_name)

    def take(self, bits: list[int]) -> list[Response]:
        """The responses at these bits, in this order, each touched (most recent last)."""
        by_bit = self._by_bit
        return self.take_entries([by_bit[bit] for bit in bits])

    def take_entries(self, entries: list[CachedResponse]) -> list[Response]:
        """take() for entries in hand (no lookups by bit). Taking the same list again,
        with nothing taken, inserted or removed in between, leaves the LRU order as it
        is: those entries are already the most recent, in that order (a training step
        takes the same list every step)."""
        last = self._last_take
        if last is not None and last[0] is entries and last[2] == self.version:
            return list(last[1])
        to_end = self._by_name.move_to_end
        responses = []
        for cached in entries:
            response = cached.response
            to_end(response.name)
            responses.append(response)
        self._last_take = (entries, responses, self.version)
        return list(responses)

    def bits(self) -> list[tuple[int, Response]]:
        return [(bit, cached.response) for bit, cached in self._by_bit.items()]

    def put(self, response: Response, signature: Request | None) -> None:
        """Insert (or refresh) a response; evicts the least recently used when full."""
        if self.capacity == 0:
            return
        existing = self._by_name.get(response.name)
        if existing is not None:
            self.erase(existing.bit)
        if not self._free_bits:
            _, oldest = next(iter(self._by_name.items()))
            self.erase(oldest.bit)
        bit = heapq.heappop(self._free_bits)
        cached = CachedResponse(response, signature, bit)
        self._by_name[response.name] = cached
        self._by_bit[bit] = cached
        self.version += 1

    def refresh(self, response: Response, signature: Request | None) -> None:
        """Replace a cached response by a new one for the same name, at its bit and its
        place in the LRU order (an allgather whose first dimensions changed)."""
        cached = self._by_name[response.name]
        cached.response, cached.signature = response, signature
        self.version += 1

    def erase(self, bit: int) -> None:
        cached = self._by_bit.pop(bit, None)
        if cached is None:
            return
        del self._by_name[cached.response.name]
        heapq.heappush(self._free_bits, bit)
        self.version += 1

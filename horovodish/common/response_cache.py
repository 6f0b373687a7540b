"""LRU cache of negotiated responses with bit positions identical on every rank.

Every rank inserts, touches and evicts in the same order (the order responses execute),
so a cached response has the same bit everywhere. In steady state a rank only says
"bits i, j, k are ready" and one bitwise-AND allreduce finds what all ranks have.
"""
from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass
from enum import Enum

from .messages import Request, Response


class CacheState(Enum):
    MISS = 0
    HIT = 1
    INVALID = 2  # cached under this name, but this rank's request now differs


@dataclass
class _Cached:
    response: Response
    signature: Request | None  # this rank's request that produced it (None: rank had joined)
    bit: int


class ResponseCache:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._by_name: OrderedDict[str, _Cached] = OrderedDict()
        self._by_bit: dict[int, _Cached] = {}
        self._free_bits: list[int] = list(range(capacity))  # smallest free bit first

    def __len__(self) -> int:
        return len(self._by_name)

    def lookup(self, request: Request) -> tuple[CacheState, int]:
        cached = self._by_name.get(request.name)
        if cached is None:
            return CacheState.MISS, -1
        if cached.signature != request:
            return CacheState.INVALID, cached.bit
        return CacheState.HIT, cached.bit

    def response(self, bit: int) -> Response:
        return self._by_bit[bit].response

    def bits(self) -> list[tuple[int, Response]]:
        return [(bit, cached.response) for bit, cached in self._by_bit.items()]

    def touch(self, bit: int) -> None:
        self._by_name.move_to_end(self._by_bit[bit].response.name)

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
        cached = _Cached(response, signature, bit)
        self._by_name[response.name] = cached
        self._by_bit[bit] = cached

    def erase(self, bit: int) -> None:
        cached = self._by_bit.pop(bit, None)
        if cached is None:
            return
        del self._by_name[cached.response.name]
        heapq.heappush(self._free_bits, bit)

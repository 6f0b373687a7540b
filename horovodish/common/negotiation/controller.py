"""Negotiation: every rank learns the same ordered list of responses each cycle.

One cycle:
  1. Each rank sorts its not-yet-negotiated requests into cache hits (a bit each),
     cache invalidations (a bit each) and uncached requests.
  2. One bitwise-AND allreduce of [flags | ready bits | not-invalid bits] tells every
     rank which cached responses all ranks have ready, which cache entries to drop, and
     whether anyone has uncached requests, has joined, or wants to shut down.
  3. Only if someone has uncached requests: gather them at the coordinator (rank 0),
     as one compact record per rank (request_records.py), which decides responses
     (see coordinator.py) and broadcasts them. Unless every rank brought the same
     uncached list (unanimous cycles, below): then each rank answers it alone.
Cached responses run first, in bit order, then the coordinator's, in its order; so the
order is the same on every rank whatever order the ranks submitted in.

Small steady allreduces ride on step 2 (``eager``, set between cycles from what every
rank agreed on, see negotiation/eager_plan.py): the AND becomes an allgather of [vector |
region], each rank packing into its region the tensors the plan expects. If every rank
did, the cycle's responses are those tensors and their data is already here: no data
collective follows. If any rank could not (FLAG_EAGER_MISS), the regions are ignored and
the cycle goes on as any other.

A unanimous cycle: the vector of step 2 also carries the digest of each rank's
uncached record, plain and inverted, so the same AND tells every rank whether all the
digests are equal (their AND equals their OR). When they are, and nothing else is going
on (no join, no invalidation, no shutdown, no tuned parameters to send), every rank
holds exactly what the coordinator would have gathered, and the coordinator's answer
to it is one response per request, in that order: each rank makes them itself, with no
gather and no broadcast. Names the coordinator holds from earlier cycles change
nothing: none can be in such a list (a name is in flight once on a rank, and the rank
that sent it before would be sending it again), so none becomes ready in it. That is
the synchronous call under a fresh name (every unnamed op, every first call). For a
list with an allgather or alltoall, whose first dimensions and splits may differ by rank
(the record leaves them out of its own digest), the digest offered is of the whole
record, those numbers included: equal digests then mean every rank sends as many rows,
split alike, and each rank makes the coordinator's answer to that itself.

A unanimous cycle's small allreduces can bring their data too (``speculate``, set by
the runtime where eager cycles are on): a rank that offers a digest packs its uncached
allreduces into its region as the plan for its own list lays them out, and, where every
rank offered that digest (the same list, so the same plan) and packed, and no cached
response is ready beside them, the cycle's responses come with their data, as in an
eager cycle. A rank that offered a digest but could not pack flags FLAG_NO_SPECULATION,
and the data is ignored: the responses then run as any other. Only where a region fits
in the exchange as it is (shared memory on one host: a new window would be collective).

The transport is injected, so this runs in one process in the unit tests.
"""
from __future__ import annotations

import hashlib
import time
from operator import attrgetter
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Generator, NamedTuple, Sequence

import numpy as np

from .coordinator import Coordinator
from ..messages import Request, RequestType, Response
from .request_records import encode as encode_requests
from .response_cache import CachedResponse, ResponseCache
from .transport import Pending, Transport
from ..stall import StallInspector
from ..timeline import Timeline

FLAG_UNCACHED = 1
FLAG_SHUTDOWN = 2
FLAG_JOINED = 4
FLAG_STALLED = 8
FLAG_EAGER_MISS = 16  # some rank did not fill its region with the plan's tensors
FLAG_NO_EAGER = 32  # rank 0 records a timeline: plan nothing (it would miss every plan)
FLAG_RESIZED = 64  # a cached allgather/alltoall has new first dims or splits (_resize)
FLAG_NO_SPECULATION = 128  # a rank offered a digest but brought no data with it
_WORD_MASK = (1 << 64) - 1
_DIGEST_BYTES = 16  # of a request record (request_records.py): its first 16 bytes
_NO_DIGEST = bytes(_DIGEST_BYTES)
# Enum members read through the class cost ~75 ns each: hot loops use these.
_JOIN = RequestType.JOIN
_ALLREDUCE = RequestType.ALLREDUCE
_ALLGATHER = RequestType.ALLGATHER
_ALLTOALL = RequestType.ALLTOALL
_RESIZABLE = (RequestType.ALLGATHER, RequestType.ALLTOALL)
# Requests a rank may answer alone in a unanimous cycle: none whose response carries
# every rank's numbers (allgather, alltoall), nor a join.
_ANSWERABLE_ALONE = frozenset(RequestType) - {RequestType.JOIN}
_VARYING = (RequestType.ALLGATHER, RequestType.ALLTOALL)  # numbers outside the record's digest
_BIT_OF = attrgetter("bit")


# A request not yet negotiated, with the time it reached the controller.
_Waiting = tuple[Request, float]


class SteadyCycle(NamedTuple):
    """The last cycle that found every request a ready cache hit (see _replay)."""
    order: list[CachedResponse]  # its cache entries in submit order
    hits: list[CachedResponse]  # ... in bit order
    hit_bits: int  # their ready bits
    requests: list[Request]  # its requests, in submit order
    cache_version: int  # the cache version it saw


@dataclass
class CycleResult:
    responses: list[Response] = field(default_factory=list)
    shutdown: bool = False
    stalled: bool = False
    negotiated_slow: bool = False
    shutdown_ranks: list[int] = field(default_factory=list)
    params: Any = None  # new tunables from rank 0's autotuner, applied after this cycle
    # The responses' cache bits when every one came from the cache and nothing else
    # happened in the cycle (what the eager plan predicts from); None otherwise.
    cached_bits: int | None = None
    # With an eager plan: whether some rank missed it, or else every rank's region
    # (the plan's data, in rank order) when its responses ride on the negotiation.
    eager_missed: bool = False
    gathered: list[np.ndarray] | None = None
    meet: Callable[[], None] | None = None  # with gathered: a split plan's second barrier
    plan: Any = None  # with gathered: the plan the data came by, where not ``eager``


class Controller:
    def __init__(self, transport: Transport, cache_capacity: int,
                 stall: StallInspector | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 world_ranks: Sequence[int] | None = None) -> None:
        self.transport = transport
        self.rank = transport.rank
        self.size = transport.size
        # What messages call each rank: inside a process set, set rank i is world_ranks[i].
        self.world_ranks = list(world_ranks) if world_ranks is not None else list(range(self.size))
        self.cache = ResponseCache(cache_capacity)
        self._words = (cache_capacity + 63) // 64
        self._rank_words = (self.size + 63) // 64
        self._vector_words = 1 + 2 * self._words + _DIGEST_BYTES // 4 + self._rank_words  # _encode
        self.clock = clock
        # A cached request that waited this long goes to the coordinator so that the
        # stall inspector (which only sees the coordinator's table) can name it.
        self._stall_age = stall.check_time / 2 if stall is not None else float("inf")
        self.coordinator = Coordinator(self.world_ranks, stall) if self.rank == 0 else None
        # Requests not yet negotiated, and those handed to the coordinator (which owns
        # their readiness from then on), by name.
        self._waiting: dict[str, _Waiting] = {}
        self._sent: dict[str, Request] = {}
        self.timeline: Timeline | None = None  # set on rank 0 while a timeline is recording
        self.params_to_send: Any = None  # rank 0: autotuned parameters for every rank
        self._joined = False
        self._others_joined = False
        self.slow_cycles = 0
        self.fast_cycles = 0
        self._last: SteadyCycle | None = None  # see _replay
        self.replay = True  # tests turn it off to compare against the general path
        # Unanimous cycles (see the module docstring); off: every uncached request goes
        # to the coordinator (tests compare the two; the scale bench times that path).
        self.unanimous = True
        self.unanimous_cycles = 0
        # This cycle's uncached list and its record, encoded as it is classified.
        self._record: tuple[list[_Waiting], int, bytes] | None = None
        self._encoded: tuple[tuple | None, np.ndarray | None] = (None, None)
        self.replays = 0
        # Set between cycles, the same on every rank (see the module docstring): the
        # plan's .bits (cache bits it expects) and .nbytes (its region); and how this
        # rank packs its tensors for it (False: it could not).
        self.eager: Any = None
        self.fill_eager: Callable[[Any, np.ndarray], bool] | None = None
        # The runtime's plan for a list of fresh responses (None: they cannot ride
        # along), for unanimous cycles that bring their data; None: they never do.
        self.speculate: Callable[[list[Response]], Any] | None = None
        self._speculated: tuple[Any, list[Response]] | None = None
        self.speculated_cycles = 0
        self.eager_cycles = 0

    @property
    def has_pending(self) -> bool:
        return bool(self._waiting or self._sent)

    def cycle(self, new_requests: list[Request], shutdown: bool = False) -> CycleResult:
        """One negotiation cycle, waiting for the other ranks."""
        steps = self.cycle_steps(new_requests, shutdown)
        next(steps).wait()
        return finish_cycle(steps)

    def cycle_steps(self, new_requests: list[Request], shutdown: bool = False
                    ) -> Generator[Pending, None, CycleResult]:
        """cycle() in two steps: it yields the posted allreduce, and once that is done,
        resuming it (``finish_cycle``) returns the result. Whoever waits need not be the
        thread that started it: a caller that stops waiting hands the rest over."""
        now = self.clock()
        waiting = self._waiting
        fresh = not waiting  # every request of this cycle arrived in it
        replayed = self._replay(new_requests, shutdown) if fresh and self.replay else None
        if replayed is not None:
            hits, hit_bits, key = replayed
            uncached: list[_Waiting] = []
        else:
            self._add(new_requests, now)
            hits, hit_bits, uncached, key = self._classify(now, shutdown)
        if self.timeline is not None and self.fill_eager is not None:
            key = (key[0] | FLAG_NO_EAGER,) + key[1:]
        eager = self.eager
        self._speculated = None  # (only this cycle's, from _speculate)
        if eager is None:
            offered = key[4] != _NO_DIGEST
            region_taken = offered and self._speculate(uncached)
            if offered and self._speculated is None:
                key = (key[0] | FLAG_NO_SPECULATION,) + key[1:]
            vector = self._encode(*key)
            # A region taken is the exchange's turn taken: the gather goes with it.
            pending = self.transport.start_gather_and(vector) if region_taken else \
                self.transport.start_allreduce_and(vector)
        else:
            region = self.transport.region(self._vector_words, eager.nbytes)
            # Filled only if this rank brings exactly the plan's hits and nothing else
            # (no flag: a timeline's op spans, say, come from the ordinary path).
            if not (hit_bits == eager.bits and not uncached and not key[0] and
                    not key[2] and self.fill_eager is not None and
                    self.fill_eager(eager, region)):
                key = (key[0] | FLAG_EAGER_MISS,) + key[1:]
            vector = self._encode(*key)
            pending = self.transport.start_gather_and(vector)
        yield pending
        outcome = pending.result()
        # A replay without flags of its own succeeds exactly when the AND is its own
        # vector (every rank has those hits ready, and nothing else): one comparison
        # in C instead of decoding.
        replayed_everywhere = replayed is not None and not key[0] and \
            outcome.tobytes() == vector.tobytes()
        flags, ready, invalid, leaving, unanimous = (0, hit_bits, 0, 0, False) \
            if replayed_everywhere else self._decode(outcome)
        ready &= ~invalid
        if replayed is not None:
            if replayed_everywhere or (ready == hit_bits and not invalid and not flags):
                # All ready everywhere, nothing else to do: the last cycle's responses.
                self.fast_cycles += 1
                self.replays += 1
                self._others_joined = False
                result = CycleResult(responses=self.cache.take_entries(self._last.hits),
                                     shutdown_ranks=_bits_of(leaving), cached_bits=hit_bits)
                if eager is not None:  # every rank filled its region: no rank flagged
                    self.eager_cycles += 1
                    result.gathered, result.meet = pending.rows(), pending.meet
                return result
            self._add(new_requests, now)  # the general path from here, as if classified
        record = fresh and not uncached and not invalid and ready == hit_bits and \
            not flags and not self._joined and self.replay
        if record:
            order = list(hits)  # submit order, before the sort below

        if invalid:
            for bit in _bits_of(invalid):
                self.cache.erase(bit)
            uncached.extend(waiting[cached.response.name] for cached in hits
                            if invalid & cached.mask)

        result = CycleResult(shutdown=bool(flags & FLAG_SHUTDOWN),
                             stalled=bool(flags & FLAG_STALLED),
                             shutdown_ranks=_bits_of(leaving),
                             eager_missed=bool(flags & FLAG_EAGER_MISS))
        self._others_joined = bool(flags & FLAG_JOINED)
        if ready:
            # Bit order (the same on every rank). Without a join, every ready bit is one
            # of this rank's hits: sorting those beats scanning the whole bit set.
            if self._joined:
                responses = self.cache.take(_bits_of(ready))
            else:
                if ready != hit_bits:  # the usual case: all of this rank's hits are ready
                    hits = [cached for cached in hits if ready & cached.mask]
                hits.sort(key=_BIT_OF)
                responses = self.cache.take_entries(hits)
            if flags & FLAG_RESIZED:
                responses = self._resize(responses)
            pop = waiting.pop
            for response in responses:
                pop(response.name, None)
            result.responses = responses
        if record and hits:
            self._last = SteadyCycle(order, hits, hit_bits,
                                     [cached.signature for cached in order], self.cache.version)

        if ready and not invalid and not flags & ~FLAG_EAGER_MISS:
            result.cached_bits = ready
            if eager is not None and not flags and ready == eager.bits:
                self.eager_cycles += 1  # every rank filled its region: no rank flagged
                result.gathered, result.meet = pending.rows(), pending.meet
        if flags & FLAG_UNCACHED:
            result.negotiated_slow = True
            if unanimous and flags & ~(FLAG_EAGER_MISS | FLAG_NO_SPECULATION) == \
                    FLAG_UNCACHED and not invalid and not leaving:
                speculated, self._speculated = self._speculated, None
                if speculated is not None and not flags & FLAG_NO_SPECULATION and not ready:
                    # Every rank packed the same plan's data, and it is all there is.
                    result.gathered, result.meet = pending.rows(), pending.meet
                    result.plan = speculated[0]
                    self.speculated_cycles += 1
                result.responses.extend(self._answer_alone(
                    uncached, speculated[1] if speculated is not None else None))
                self.unanimous_cycles += 1
            else:
                responses, result.params = self._negotiate_slow(uncached)
                result.responses.extend(responses)
            self.slow_cycles += 1
        else:
            self.fast_cycles += 1
        return result

    def _add(self, new_requests: list[Request], now: float) -> None:
        waiting, timeline, join = self._waiting, self.timeline, _JOIN
        for request in new_requests:
            waiting[request.name] = (request, now)
            if request.type is join:
                self._joined = True
            elif timeline is not None:
                timeline.negotiate_start(request.name, request.type.opname)
                timeline.rank_ready(request.name, self.rank)

    def _replay(self, new_requests: list[Request], shutdown: bool
                ) -> tuple[list[CachedResponse], int, tuple] | None:
        """In steady state a cycle brings the same requests as the last one that found
        every request a ready cache hit: then classifying them one by one (and sorting
        and bookkeeping them) gives the same hits, bits and vector again, so check that
        each request is still the same cached one and reuse the rest. None when
        anything differs; the caller then takes the general path. Decided on this rank
        alone, which is safe because it sends exactly what _classify would have sent.

        An unchanged cache version means each name still maps to the same entry with
        the same signature, and those signatures are the recorded requests: so equal
        request lists (compared in C) are the whole test. Fresh requests are never stale
        (stall age > 0), and no rank has joined."""
        last = self._last
        if last is None or last.cache_version != self.cache.version or shutdown or \
                self._joined or self._others_joined or self.timeline is not None or \
                self.params_to_send is not None or not self._stall_age > 0 or \
                new_requests != last.requests:
            return None
        flags = 0
        if self.coordinator is not None and self.coordinator.check_stall():
            flags |= FLAG_SHUTDOWN | FLAG_STALLED
        return list(last.order), last.hit_bits, (flags, last.hit_bits, 0, 0, _NO_DIGEST)

    def _classify(self, now: float, shutdown: bool
                  ) -> tuple[list[CachedResponse], int, list[_Waiting], tuple]:
        ready = invalid = 0  # bit sets as Python ints: cheap to build and to test
        resized = False
        hits: list[CachedResponse] = []
        uncached: list[_Waiting] = []
        caching = self._words > 0
        cached_as = self.cache.cached_as
        stale_before = now - self._stall_age  # submitted earlier: show it to the coordinator
        others_joined = self._others_joined
        join, allreduce = _JOIN, _ALLREDUCE
        for name, waiting in self._waiting.items():
            request, submitted_at = waiting
            cached = cached_as(name) if caching else None
            if cached is None or request.type is join:
                uncached.append(waiting)
            # A hit, unless this rank's request differs from the cached one, or bypassing
            # the cache: for a stale request (so the stall inspector can name it) and,
            # once some rank joined, for non-allreduce (so the join error is raised).
            elif cached.signature == request and submitted_at > stale_before and not (
                    others_joined and request.type is not allreduce):
                ready |= cached.mask
                hits.append(cached)
            elif _resized(cached.signature, request) and submitted_at > stale_before and \
                    not others_joined:
                ready |= cached.mask  # a hit whose first dimension rides _resize
                hits.append(cached)
                resized = True
            else:
                invalid |= 1 << cached.bit
                uncached.append(waiting)
        hit_bits = ready
        if self._joined:
            # A joined rank is ready for every cached allreduce: it contributes zeros.
            for bit, response in self.cache.bits():
                if response.type == RequestType.ALLREDUCE:
                    ready |= 1 << bit
        flags = 0
        if uncached or self.params_to_send is not None:
            flags |= FLAG_UNCACHED  # new parameters travel with the coordinator's broadcast
        if shutdown:
            flags |= FLAG_SHUTDOWN
        if resized:
            flags |= FLAG_RESIZED
        if self._joined:
            flags |= FLAG_JOINED
        if self.coordinator is not None and self.coordinator.check_stall():
            flags |= FLAG_SHUTDOWN | FLAG_STALLED
        leaving = 1 << self.rank if shutdown else 0
        return hits, hit_bits, uncached, (flags, ready, invalid, leaving,
                                          self._digest(uncached))

    def _digest(self, uncached: list[_Waiting]) -> bytes:
        """This cycle's record (kept for the gather) and the digest this rank offers
        for a unanimous cycle: the record's, or none where it may not be answered
        without the coordinator (see the module docstring)."""
        self._record = None
        if not uncached:
            return _NO_DIGEST
        record = encode_requests([request for request, _ in uncached])
        self._record = (uncached, len(uncached), record)
        if not self.unanimous or self._joined or self.params_to_send is not None or \
                self.timeline is not None or any(request.type not in _ANSWERABLE_ALONE for request, _ in uncached):
            return _NO_DIGEST
        if any(request.type in _VARYING for request, _ in uncached):
            return hashlib.blake2b(record, digest_size=_DIGEST_BYTES).digest()
        return record[:_DIGEST_BYTES]

    def _encode(self, flags: int, ready: int, invalid: int, leaving: int,
                digest: bytes = _NO_DIGEST) -> np.ndarray:
        """[~flags | ready | ~invalid | digest | ~digest | ~leaving ranks] as uint64
        words: one bitwise AND computes the AND of the ready bits and of the digests,
        and the OR of everything stored inverted. Steady state sends the same vector
        every cycle: the last one is kept (transports only read it)."""
        key = (flags, ready, invalid, leaving, digest)
        if key == self._encoded[0]:
            return self._encoded[1]
        width, rank_width = 8 * self._words, 8 * self._rank_words
        raw = ((~flags) & _WORD_MASK).to_bytes(8, "little") + ready.to_bytes(width, "little") \
            + ((~invalid) & _mask(width)).to_bytes(width, "little") \
            + digest + ((~int.from_bytes(digest, "little")) & _mask(_DIGEST_BYTES)).to_bytes(
                _DIGEST_BYTES, "little") \
            + ((~leaving) & _mask(rank_width)).to_bytes(rank_width, "little")
        vector = np.frombuffer(raw, dtype=np.uint64)  # read-only: nobody writes it
        self._encoded = (key, vector)
        return vector

    def _decode(self, words: np.ndarray) -> tuple[int, int, int, int, bool]:
        """(flags, ready, invalid, leaving, whether every rank offered one digest)."""
        raw = words.tobytes()
        width = 8 * self._words
        flags = ~int.from_bytes(raw[:8], "little") & _WORD_MASK
        ready = int.from_bytes(raw[8:8 + width], "little")
        invalid = ~int.from_bytes(raw[8 + width:8 + 2 * width], "little") & _mask(width)
        at = 8 + 2 * width
        anded = int.from_bytes(raw[at:at + _DIGEST_BYTES], "little")
        ored = ~int.from_bytes(raw[at + _DIGEST_BYTES:at + 2 * _DIGEST_BYTES], "little") \
            & _mask(_DIGEST_BYTES)
        leaving_raw = raw[at + 2 * _DIGEST_BYTES:]
        leaving = ~int.from_bytes(leaving_raw, "little") & _mask(len(leaving_raw))
        return flags, ready, invalid, leaving, anded != 0 and anded == ored

    def _resize(self, responses: list[Response]) -> list[Response]:
        """Some rank's cached allgather or alltoall changed its first dimension or its
        splits (FLAG_RESIZED): every rank sends those numbers for each ready allgather
        and alltoall, in response order (the same on every rank), in one small allgather
        instead of a slow-path cycle, and the cache keeps the new ones (as this rank's
        signature, its request)."""
        at = [i for i, response in enumerate(responses) if response.type in _RESIZABLE]
        if not at:
            return responses
        size, waiting = self.size, self._waiting
        mine: list[int] = []
        for i in at:
            waited = waiting.get(responses[i].name)
            request = waited[0] if waited is not None else None
            rows = request.shape[0] if request is not None and request.shape else 0
            mine.append(rows)
            if responses[i].type is _ALLTOALL:
                mine.extend(request.splits if request is not None and request.splits
                            is not None else [rows // size] * size)
        everyone = self.transport.allgather_ints(np.asarray(mine, dtype=np.int64))
        responses = list(responses)
        column = 0
        for i in at:
            old = responses[i]
            first_dims = everyone[:, column].tolist()
            shape = (first_dims[0],) + old.shape[1:] if old.shape else old.shape
            if old.type is _ALLTOALL:
                splits = tuple(map(tuple, everyone[:, column + 1:column + 1 + size].tolist()))
                new = replace(old, shape=shape, splits=splits)
                column += 1 + size
            else:
                new = replace(old, shape=shape, first_dims=tuple(first_dims))
                column += 1
            waited = waiting.get(old.name)
            self.cache.refresh(new, waited[0] if waited is not None else None)
            responses[i] = new
        return responses

    def _answer_alone(self, uncached: list[_Waiting],
                      responses: list[Response] | None = None) -> list[Response]:
        """A unanimous cycle's responses (made already where they were speculated on)."""
        if responses is None:
            responses = [_answer(request, self.size) for request, _ in uncached]
        waiting, put = self._waiting, self.cache.put
        for (request, _), response in zip(uncached, responses):
            del waiting[request.name]
            put(response, request)
        return responses

    def _speculate(self, uncached: list[_Waiting]) -> bool:
        """Pack this rank's data for the plan of its own list, where the runtime has one
        and its region fits the exchange as it is (see the module docstring); sets
        _speculated if it did. Whether it took a region (then the exchange must be
        start_gather_and, packed or not)."""
        if self.speculate is None or self.fill_eager is None:
            return False
        responses = [_answer(request, self.size) for request, _ in uncached]
        plan = self.speculate(responses)
        if plan is None or plan.split or \
                plan.nbytes > self.transport.region_capacity(self._vector_words):
            return False
        if self.fill_eager(plan, self.transport.region(self._vector_words, plan.nbytes)):
            self._speculated = (plan, responses)
        return True

    def _negotiate_slow(self, uncached: list[_Waiting]) -> tuple[list[Response], Any]:
        requests = [request for request, _ in uncached]
        for request in requests:
            del self._waiting[request.name]
            self._sent[request.name] = request
        kept = self._record
        record = kept[2] if kept is not None and kept[0] is uncached and \
            kept[1] == len(uncached) else encode_requests(requests)
        self._record = None
        gathered = self.transport.gather_records(record)
        payload = None
        if self.coordinator is not None:
            assert gathered is not None
            self.coordinator.add_gathered(gathered, self.timeline)
            payload = (self.coordinator.ready_responses(), self.params_to_send)
            self.params_to_send = None
        responses, params = self.transport.bcast(payload)
        for response in responses:
            # None: a rank that had joined gets responses for tensors it never submitted.
            request = self._sent.pop(response.name, None)
            if response.type == RequestType.JOIN:
                self._joined = False
            elif response.error is None:
                self.cache.put(response, request)
        return responses, params


def _answer(request: Request, size: int) -> Response:
    """What the coordinator answers a request every rank of size sent alike, its first
    dimension and splits included (Coordinator._response for one share)."""
    first_dims = splits = None
    if request.type in _VARYING:
        rows = int(request.shape[0]) if request.shape else 0
        if request.type is RequestType.ALLGATHER:
            first_dims = (rows,) * size
        else:
            sent = tuple(map(int, request.splits)) if request.splits is not None \
                else (rows // size,) * size
            splits = (sent,) * size
    return Response(request.name, request.type, request.dtype, tuple(request.shape),
                    request.reduce_op, int(request.root_rank), float(request.prescale),
                    float(request.postscale), request.device, first_dims=first_dims,
                    splits=splits)


def finish_cycle(steps: Generator[Pending, None, CycleResult]) -> CycleResult:
    """Resume a cycle from ``Controller.cycle_steps`` whose allreduce is done."""
    try:
        steps.send(None)
    except StopIteration as end:
        return end.value
    raise RuntimeError("a negotiation cycle waited twice")


def _resized(cached: Request | None, request: Request) -> bool:
    """An allgather or alltoall request equal to the cached one but for its first
    dimension and the values of its splits (explicit on both, or on neither)."""
    return (request.type in _RESIZABLE and cached is not None
            and cached.type is request.type
            and len(request.shape) == len(cached.shape) > 0
            and request.shape[1:] == cached.shape[1:] and request[2] == cached[2]
            and request[4:9] == cached[4:9]
            and (request.splits is None) == (cached.splits is None))


def _mask(nbytes: int) -> int:
    return (1 << (8 * nbytes)) - 1


def _bits_of(bits: int) -> list[int]:
    """Positions of the set bits, ascending."""
    positions = []
    while bits:
        low = bits & -bits
        positions.append(low.bit_length() - 1)
        bits ^= low
    return positions

"""The plan of an eager cycle: which small steady allreduces ride on the next negotiation.

In steady state the next cycle is predictable: the same cache hits as one to four
cycles ago. Its allreduces then travel with the negotiation's bit vector, packed into
each rank's region and reduced from the gathered regions (execution/piggyback.py);
larger regions, on one host, by slices.

Every rank must run the same collective each cycle, so the plan is decided only from
what every rank agreed on (``EagerPredictor``): a plan starts once the cache hits of
recent cycles repeat, and ends at a cycle with other responses or with a rank that
could not fill its region (the controller's FLAG_EAGER_MISS; that cycle then runs as
any other).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..messages import ReduceOp, RequestType, Response

# Default bytes a rank receives in one eager cycle (the region times size - 1). Measured
# on 2 ranks of one host (docs/tuning.md): through shared memory the eager cycle beat
# the negotiate-then-reduce one from 16 to 128 KiB and lost at 256 KiB, where each rank
# reduces the whole of every region instead of its slice. Through MPI's allgather
# (ranks on several hosts) it lost from 64 KiB on under MPICH.
DEFAULT_EAGER_LIMIT = 128 << 10
CROSS_HOST_EAGER_LIMIT = 16 << 10
# Regions up to this size (per rank) ride along reduced by slices, on one host. On 2
# ranks (docs/tuning.md) that beat the negotiate-then-shared-memory cycle at 1 and 2 MiB
# in every run and at 256 and 512 KiB in four of seven; at 4 MiB as often lost as won.
SPLIT_EAGER_LIMIT = 2 << 20

_ALIGN = 8  # each group's place in the region starts on a word: any dtype views it
_HOST = "cpu"


@dataclass(frozen=True)
class EagerPlan:
    """The responses one eager cycle expects, and where each group sits in the region."""
    bits: int  # their cache bits
    groups: list[list[Response]]  # as the fusion planner groups them
    offsets: list[int]  # each group's byte offset in the region
    nbytes: int  # the region's size
    # Reduced by slices: each rank reduces its slice of every group into its own
    # region, the ranks meet once more, and each copies every slice out (one host,
    # regions above the limit: see plan_eager).
    split: bool = False


def plan_eager(groups: list[list[Response]], bits: int, size: int, limit: int,
               split_limit: int = 0) -> EagerPlan | None:
    """The plan for these planned responses, or None where they cannot ride along:
    anything but host allreduces of a reducible kind, or more than limit bytes for a
    rank to receive. Up to split_limit bytes a rank (a region) they ride along reduced
    by slices (EagerPlan.split): a second meeting, but each rank reduces 1/size of
    the bytes, as the shared-memory backend does, and no negotiation before."""
    offsets, offset = [], 0
    for group in groups:
        for response in group:
            if response.type != RequestType.ALLREDUCE or response.error is not None or \
                    response.device != _HOST or response.reduce_op == ReduceOp.ADASUM or \
                    (response.nbytes == 0 and response.count > 0):  # a dtype it cannot size
                return None
        offsets.append(offset)
        offset += -(-sum(r.nbytes for r in group) // _ALIGN) * _ALIGN
    if size < 2:
        return None
    if offset * (size - 1) <= limit:
        return EagerPlan(bits, groups, offsets, offset)
    if offset <= split_limit:
        return EagerPlan(bits, groups, offsets, offset, split=True)
    return None


class EagerPredictor:
    """The next cycle's plan, from agreed results only, so every rank has the same.

    The cache hits of the last cycles that had responses are kept in order. If the last
    2p of them repeat with a period p of at most MAX_PERIOD cycles (the same tensor
    every call: p = 1; a loss and a metric in turn: p = 2), the next cycle is predicted
    to bring the hits of p cycles ago. A cycle with uncached responses, or one some rank
    missed, breaks every period, so a wrong guess costs one cycle."""

    MAX_PERIOD = 4

    def __init__(self, size: int, limit: int = DEFAULT_EAGER_LIMIT,
                 split_limit: int = 0) -> None:
        self.size = size
        self.limit = limit
        self.split_limit = split_limit  # see plan_eager; 0: never by slices
        self._history: list[int | None] = []  # cache hits per cycle; None: other work
        self._plans: dict[int, EagerPlan | None] = {}  # by cache hits, as last seen
        self.plan: EagerPlan | None = None

    def set_limit(self, limit: int, split_limit: int = 0) -> None:
        """New limits, with nothing learnt kept (through Runtime.set_eager_limit, which
        says when it is safe). The plan in force (used by idle cycles alike on every
        rank) ends at the next cycle with responses."""
        self.limit, self.split_limit = limit, split_limit
        self._plans.clear()
        self._history.clear()

    def after_cycle(self, responses: list[Response], cached_bits: int | None,
                    missed: bool, groups: list[list[Response]]) -> EagerPlan | None:
        """Update from one cycle's agreed outcome (groups: its responses as planned)."""
        if not responses:
            return self.plan  # an idle cycle, or all waiting on a peer: nothing learnt
        history = self._history
        bits = None if missed else cached_bits
        plan = self.plan
        if plan is not None and bits == plan.bits and history and history[-1] == bits and \
                self._plans.get(bits) is plan:
            history.append(bits)  # the same tensors again: period 1 holds, same plan
            if len(history) > 2 * self.MAX_PERIOD:
                del history[0]
            return plan
        if bits is None:
            # The response cache changes only in such cycles (new entries, dropped
            # ones), after which a bit may stand for another tensor: forget the plans.
            self._plans.clear()
        history.append(bits)
        if len(history) > 2 * self.MAX_PERIOD:
            del history[0]
        if bits is not None and bits not in self._plans:
            if len(self._plans) >= 4 * self.MAX_PERIOD:
                self._plans.clear()
            self._plans[bits] = plan_eager(groups, bits, self.size, self.limit,
                                           self.split_limit)
        self.plan = None
        for period in range(1, self.MAX_PERIOD + 1):
            recent = history[-2 * period:]
            if len(recent) == 2 * period and None not in recent and \
                    recent[:period] == recent[period:]:
                self.plan = self._plans.get(recent[period])  # p cycles ago
                break
        return self.plan

"""Small steady allreduces ride on the negotiation: one collective per cycle, not two.

A synchronous small allreduce makes the ranks meet twice: for the negotiation (a bit
vector), then for the data. Each meeting costs MPI's latency plus the ranks' skew, and
below about 128 KiB the two together cost more than the data itself (docs/tuning.md).
In steady state the next cycle is predictable: the same cache hits as one to four
cycles ago. Then every rank packs those tensors into a region that travels with its bit
vector in one exchange (shared memory on one host, an allgather across hosts), and
reduces the gathered regions locally; larger regions, on one host, by slices.

Every rank must run the same collective each cycle, so the plan is decided only from
what every rank agreed on (``EagerPredictor``): a plan starts once the cache hits of
recent cycles repeat, and ends at a cycle with other responses or with a rank that
could not fill its region (the controller's FLAG_EAGER_MISS; that cycle then runs as
any other).
Reductions go in rank order with numpy, as the shared-memory backend's do, with the
same scaling (Average's 1/size, prescale, postscale) as the fusion-buffer path. So a
small call that goes eager follows shared memory's rules where MPI's differ: NaN wins
in Min and Max (np.minimum), and on 3 or more ranks floating sums may round
differently in the last bit than MPI's order.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from ..messages import ReduceOp, RequestType, Response
from ..entry import Entry
from .arithmetic import divide_toward_zero, scale_into
from .fused_group import Workspace, hand_out, pack_inputs, unpack_outputs

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


class EagerGroup(NamedTuple):
    """What one planned group means for this rank, worked out once per plan: a steady
    cycle then only packs and reduces."""
    responses: list[Response]
    counts: list[int]
    dtype: np.dtype
    ufunc: np.ufunc  # the reduction (Average as Sum)
    prescale: float  # as applied, Average's 1/size folded in (Executor._scales)
    postscale: float
    divide_by: int  # an integer Average's exact division, or 0
    offset: int  # its bytes in the region
    nbytes: int


class EagerViews:
    """An eager plan's groups, with their views of each region it has met (the
    transports hand out the same few region arrays again and again)."""

    def __init__(self, plan: EagerPlan, groups: list[EagerGroup]) -> None:
        self.plan = plan
        self.groups = groups
        self.names = [[response.name for response in group] for group in plan.groups]
        self._views: dict[int, tuple[Any, list[np.ndarray]]] = {}
        self._parts: dict[int, tuple[Any, list[list[np.ndarray]]]] = {}

    def parts(self, rows: list[np.ndarray]) -> list[list[np.ndarray]]:
        """Per group, every rank's place in the gathered regions (rows, in rank order):
        the transports hand out the same rows list for a layout each time."""
        known = self._parts.get(id(rows))
        if known is None or known[0] is not rows:
            of = [self.of(row) for row in rows]
            known = (rows, [[views[index] for views in of]
                            for index in range(len(self.groups))])
            self._parts[id(rows)] = known
        return known[1]

    def of(self, region: np.ndarray) -> list[np.ndarray]:
        """Each group's place in region, as its dtype."""
        known = self._views.get(id(region))
        if known is None or known[0] is not region:
            known = (region, [region[g.offset:g.offset + g.nbytes].view(g.dtype)
                              for g in self.groups])
            self._views[id(region)] = known
        return known[1]


def pack(views: list[np.ndarray], groups: list[EagerGroup],
         entries: list[list[Entry]]) -> None:
    """This rank's contribution to each group, prescaled, into its place (views)."""
    for view, group, mine in zip(views, groups, entries):
        if len(mine) == 1:  # (torch's default op, Average, prescales float32 by 1/size)
            if group.prescale == 1.0:
                np.copyto(view, mine[0].tensor.reshape(-1))
            else:
                scale_into(view, mine[0].tensor.reshape(-1), group.prescale)
        else:
            pack_inputs(view, mine, group.counts, group.dtype, group.prescale)


def reduce_gathered(group: EagerGroup, parts: list[np.ndarray], entries: list[Entry],
                    workspace: Workspace) -> list:
    """Reduce every rank's contribution to group (parts, in rank order) where the
    callers read it; the result for each entry, as a backend returns them."""
    buf, owned, single = _destination(group, entries, parts[0].size, workspace)
    _reduce_in_rank_order(group, parts, buf)
    return _hand_back(group, entries, buf, owned, single, workspace)


def reduce_my_slice(group: EagerGroup, parts: list[np.ndarray], rank: int,
                    workspace: Workspace) -> None:
    """Split plans, before the second meeting: this rank's slice of group, reduced over
    every rank's part in rank order and scaled, into its own part (no other rank reads
    that slice of this rank's region until the meeting)."""
    size = len(parts)
    count = parts[0].size
    start, stop = count * rank // size, count * (rank + 1) // size
    mine = parts[rank][start:stop]
    # Ranks 0 and 1 may sum into their own part (an operand of the first step); a later
    # rank's part is still to be added, so its sum goes through a fusion buffer.
    total = mine if rank < 2 else workspace.buffers.get(group.dtype, stop - start)
    _reduce_in_rank_order(group, [part[start:stop] for part in parts], total)
    if total is not mine:
        np.copyto(mine, total)


def gather_slices(group: EagerGroup, parts: list[np.ndarray], entries: list[Entry],
                  workspace: Workspace) -> list:
    """Split plans, after the second meeting: every rank's reduced slice where the
    callers read it; the result for each entry, as a backend returns them."""
    size, count = len(parts), parts[0].size
    buf, owned, single = _destination(group, entries, count, workspace)
    for rank, part in enumerate(parts):
        start, stop = count * rank // size, count * (rank + 1) // size
        np.copyto(buf[start:stop], part[start:stop])
    return _hand_back(group, entries, buf, owned, single, workspace)


def _reduce_in_rank_order(group: EagerGroup, parts: list[np.ndarray], out: np.ndarray
                          ) -> None:
    """out = the parts reduced in rank order, then divided and postscaled (out may be
    parts[0] or parts[1])."""
    ufunc = group.ufunc
    ufunc(parts[0], parts[1], out=out)
    for part in parts[2:]:
        ufunc(out, part, out=out)
    if group.divide_by:
        divide_toward_zero(out, group.divide_by)
    if group.postscale != 1.0:
        scale_into(out, out, group.postscale)


# One small result the runtime owns is a fresh array: malloc reuses heap memory whose
# pages are mapped already at these sizes (glibc's mmap threshold is 128 KiB or more),
# and np.empty costs 0.17 us against a result block's 0.75 (bookkeeping and reference
# counts). Above it, fresh memory would fault its pages in on every call: blocks.
FRESH_RESULT_BYTES = 64 << 10


def _destination(group: EagerGroup, entries: list[Entry], count: int,
                 workspace: Workspace) -> tuple[np.ndarray, bool, bool]:
    """Where a group's result goes, (buffer, owned, single): a result block if some
    caller lets the runtime own its result, one caller's contiguous output, or the
    fusion buffer to copy out from."""
    if len(entries) == 1:  # the common case, without a generator
        output = entries[0].output
        owned = output is None
        single = not owned and output.flags.c_contiguous
    else:
        owned = any(entry.output is None for entry in entries)
        single = False
    if owned:
        if len(entries) == 1 and count * group.dtype.itemsize <= FRESH_RESULT_BYTES:
            return np.empty(count, group.dtype), True, False
        return workspace.result_blocks.take(group.dtype, count), True, False
    if single:
        return entries[0].output.reshape(-1), False, True
    return workspace.buffers.get(group.dtype, count), False, False


def _hand_back(group: EagerGroup, entries: list[Entry], buf: np.ndarray, owned: bool,
               single: bool, workspace: Workspace) -> list:
    """The result for each entry, from the buffer _destination chose."""
    if owned:
        return hand_out(buf, entries, group.responses)
    if not single:
        unpack_outputs(workspace.copier, buf, entries, group.counts, 1.0)
    return [entry.output for entry in entries]

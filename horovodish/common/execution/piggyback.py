"""Small steady allreduces ride on the negotiation: one collective per cycle, not two.

A synchronous small allreduce makes the ranks meet twice: for the negotiation (a bit
vector), then for the data. Each meeting costs MPI's latency plus the ranks' skew, and
below about 128 KiB the two together cost more than the data itself (docs/tuning.md).
When the next cycle is predictable (negotiation/eager_plan.py plans it, from what every
rank agreed on), every rank packs those tensors into a region that travels with its bit
vector in one exchange (shared memory on one host, an allgather across hosts), and
reduces the gathered regions locally; larger regions, on one host, by slices. This
module packs and reduces.

Reductions go in rank order with numpy, as the shared-memory backend's do, with the
same scaling (Average's 1/size, prescale, postscale) as the fusion-buffer path. So a
small call that goes eager follows shared memory's rules where MPI's differ: NaN wins
in Min and Max (np.minimum), and on 3 or more ranks floating sums may round
differently in the last bit than MPI's order.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ..messages import Response
from ..entry import Entry
from ..negotiation.eager_plan import EagerPlan
from .arithmetic import divide_toward_zero, scale_into
from .fused_group import Workspace, hand_out, pack_inputs, unpack_outputs


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
        self._stacked: dict[int, tuple[Any, list[np.ndarray] | None]] = {}

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

    def stacked(self, rows: list[np.ndarray]) -> list[np.ndarray] | None:
        """Per group, every rank's place as one (ranks, count) array, where the rows lie
        evenly spaced in one buffer (MPI's allgather delivers them so): reduced in one
        numpy call rather than one a rank. None where they do not, or where there are
        too few ranks for it to pay."""
        if len(rows) < STACKED_FROM_RANKS:
            return None
        known = self._stacked.get(id(rows))
        if known is None or known[0] is not rows:
            matrix = _evenly_spaced(rows)
            known = (rows, None if matrix is None else [
                matrix[:, g.offset:g.offset + g.nbytes].view(g.dtype) for g in self.groups])
            self._stacked[id(rows)] = known
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


# From this many ranks a plan's gathered parts are reduced as one (ranks, count) array
# (EagerViews.stacked): one numpy call instead of one a rank took rank 0's eager cycle
# of four float32 scalars from 0.39 to 0.2 ms at 1,024 simulated ranks, and from 1.5
# to 0.6 ms at 4,096 (python -m horovodish.bench.negotiation, a 2-core x86 machine).
STACKED_FROM_RANKS = 8


def reduce_gathered(group: EagerGroup, parts: list[np.ndarray] | np.ndarray,
                    entries: list[Entry], workspace: Workspace) -> list:
    """Reduce every rank's contribution to group (parts, in rank order: a list of
    views, or one (ranks, count) array from EagerViews.stacked) where the callers read
    it; the result for each entry, as a backend returns them."""
    buf, owned, single = _destination(group, entries, sum(group.counts), workspace)
    if isinstance(parts, np.ndarray):
        _reduce_stacked(group, parts, buf)
    else:
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
    _finish_reduction(group, out)


def _reduce_stacked(group: EagerGroup, stacked: np.ndarray, out: np.ndarray) -> None:
    """_reduce_in_rank_order over the rows of one (ranks, count) array. numpy reduces
    its first axis row after row, in rank order, except for a single column, which it
    sums pairwise: that one is accumulated (always in order) instead. tests/common/
    test_piggyback_stacked.py holds both to the rank-order loop, bit for bit."""
    if stacked.shape[1] == 1:
        running = np.empty(stacked.shape, stacked.dtype)
        group.ufunc.accumulate(stacked, axis=0, out=running)
        out[:] = running[-1]
    else:
        group.ufunc.reduce(stacked, axis=0, out=out)
    _finish_reduction(group, out)


def _finish_reduction(group: EagerGroup, out: np.ndarray) -> None:
    """An integer Average's exact division, then the postscale, in place."""
    if group.divide_by:
        divide_toward_zero(out, group.divide_by)
    if group.postscale != 1.0:
        scale_into(out, out, group.postscale)


def _evenly_spaced(rows: list[np.ndarray]) -> np.ndarray | None:
    """The rows (uint8, one length) as one (ranks, bytes) view of the buffer they share,
    or None unless they lie in it at one stride, each on a word."""
    base, size = rows[0].base, rows[0].size
    if base is None or any(row.base is not base or row.size != size for row in rows):
        return None
    starts = np.fromiter((row.__array_interface__["data"][0] for row in rows),
                         dtype=np.int64, count=len(rows))
    stride = int(starts[1] - starts[0])
    low = base.__array_interface__["data"][0]
    if stride < size or stride % 8 or starts[0] % 8 or \
            not (np.diff(starts) == stride).all() or starts[0] < low or \
            int(starts[-1]) + size > low + base.nbytes:
        return None
    return np.lib.stride_tricks.as_strided(rows[0], shape=(len(rows), size),
                                           strides=(stride, 1), writeable=False)


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

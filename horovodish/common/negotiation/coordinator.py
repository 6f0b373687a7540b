"""The coordinator's decisions: count readiness, validate agreement, order responses.

Pure logic on rank 0's side of negotiation. It receives every rank's uncached requests
as compact records (request_records.py: ranks that sent the same list arrive as one
group), and when every rank (joined ranks count as ready for allreduce) has submitted a
name it emits one response for it; if the ranks disagree, an error response that names
the tensor, the op, the ranks and exactly what differed.

Its work grows with the number of distinct request lists, not with ranks x tensors: a
name carries one share per group that submitted it, and a share is a rank array and one
agreed request, so counting readiness is a sum and validating a name whose ranks all
agree is a single comparison.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping, Sequence

import numpy as np

from ..messages import ReduceOp, Request, RequestType, Response
from ..stall import StallInspector
from ..timeline import Timeline
from .request_records import GatheredRecords, RecordGroup, varying_width

JOIN_NAME = "join"
_JOIN = RequestType.JOIN
_ALLGATHER = RequestType.ALLGATHER
_ALLTOALL = RequestType.ALLTOALL
_MAX_RANK_PIECES = 12  # a longer rank list in an error is cut, with its count


def format_ranks(ranks: Sequence[int]) -> str:
    """'rank 6', 'ranks 1, 4', 'ranks 0-2730, 2732-4095' (runs of three or more as ranges)."""
    ranks = sorted(ranks)
    pieces: list[str] = []
    start = 0
    while start < len(ranks):
        end = start
        while end + 1 < len(ranks) and ranks[end + 1] == ranks[end] + 1:
            end += 1
        if end - start >= 2:
            pieces.append(f"{ranks[start]}-{ranks[end]}")
        else:
            pieces.extend(str(rank) for rank in ranks[start:end + 1])
        start = end + 1
    if len(pieces) > _MAX_RANK_PIECES:
        pieces = pieces[:_MAX_RANK_PIECES - 2] + [f"... ({len(ranks)} ranks in all)"]
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(pieces)


def _describe(values: list[tuple[object, np.ndarray]]) -> str:
    """'rank 0: float32; ranks 1, 2: float64': (value, world ranks) pairs grouped by the
    value's text, groups in the order of their lowest rank."""
    groups: dict[str, list[np.ndarray]] = {}
    for value, ranks in sorted(values, key=lambda pair: int(pair[1].min())):
        groups.setdefault(_format(value), []).append(ranks)
    return "; ".join(f"{format_ranks(np.concatenate(parts).tolist())}: {text}"
                     for text, parts in groups.items())


def _format(value: object) -> str:
    if isinstance(value, RequestType):
        return value.opname
    if isinstance(value, ReduceOp):
        return value.name.capitalize()
    if isinstance(value, tuple):
        return "(" + ", ".join(map(str, value)) + ("," if len(value) == 1 else "") + ")"
    return str(value)


def _lowest_rank(share: _Share) -> int:
    return int(share.ranks[0])


@dataclass
class _Share:
    """The ranks of one group that submitted a name, and what they submitted."""
    ranks: np.ndarray
    request: Request  # as agreed (allgather/alltoall first dimension -1)
    varying: np.ndarray | None  # (len(ranks), width): first dimension, then splits


@dataclass
class _Pending:
    shares: list[_Share] = field(default_factory=list)
    count: int = 0  # ranks that submitted it


def _submitted(pending: _Pending) -> set[int]:
    """The ranks that submitted a name."""
    return set(np.concatenate([share.ranks for share in pending.shares]).tolist())


class _WaitingRanks(Mapping[str, set[int]]):
    """name -> the ranks that submitted it, built only for the names asked about (the
    stall inspector asks about the old ones)."""

    def __init__(self, table: dict[str, _Pending]) -> None:
        self._table = table

    def __getitem__(self, name: str) -> set[int]:
        return _submitted(self._table[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self._table)

    def __len__(self) -> int:
        return len(self._table)


class Coordinator:
    def __init__(self, world_ranks: Sequence[int], stall: StallInspector | None = None) -> None:
        self.size = len(world_ranks)
        # Messages name world ranks: inside a process set, set rank i is world_ranks[i].
        self.world_ranks = list(world_ranks)
        self._world = np.asarray(self.world_ranks, dtype=np.int64)
        self.stall = stall
        self._table: dict[str, _Pending] = {}
        self._joined: set[int] = set()
        self._last_joined = -1

    @property
    def waiting(self) -> Mapping[str, set[int]]:
        return _WaitingRanks(self._table)

    @property
    def joined(self) -> set[int]:
        return set(self._joined)

    def add_gathered(self, gathered: GatheredRecords, timeline: Timeline | None = None) -> None:
        """Every rank's record of one cycle (``request_records``)."""
        # Within a cycle ranks join in rank order: the last to join is the highest.
        joined = [self._add_group(group, timeline) for group in gathered.groups()]
        if max(joined, default=-1) >= 0:
            self._last_joined = max(joined)

    def _add_group(self, group: RecordGroup, timeline: Timeline | None) -> int:
        """Adds a group's requests; the group's highest rank if it joined, else -1."""
        table, stall = self._table, self.stall
        ranks, varying, column, joined = group.ranks, group.varying, 0, -1
        size = len(ranks)
        for request in group.requests:
            kind = request.type
            if kind is _JOIN:
                self._joined.update(ranks.tolist())
                joined = int(ranks[-1])
                continue
            name = request.name
            pending = table.get(name)
            if pending is None:
                pending = table[name] = _Pending()
                if stall is not None:
                    stall.seen(name)
            if kind is _ALLGATHER or kind is _ALLTOALL:
                width = varying_width(request)
                pending.shares.append(_Share(ranks, request, varying[:, column:column + width]))
                column += width
            else:
                pending.shares.append(_Share(ranks, request, None))
            pending.count += size
            if timeline is not None:  # rank 0 marks itself at submit
                for rank in ranks.tolist():
                    if rank != 0:
                        timeline.negotiate_start(name, kind.opname)
                        timeline.rank_ready(name, rank)
        return joined

    def ready_responses(self) -> list[Response]:
        """Responses for every name all ranks have, in the order names first arrived."""
        responses = []
        size, joined = self.size, self._joined
        for name in list(self._table):
            pending = self._table[name]
            if pending.count == size or (joined and self._ready_with_joined(pending)):
                del self._table[name]
                if self.stall is not None:
                    self.stall.done(name)
                responses.append(self._response(name, pending))
        if joined and len(joined) == size:
            responses.append(Response(JOIN_NAME, RequestType.JOIN, last_joined=self._last_joined))
            joined.clear()
        return responses

    def _ready_with_joined(self, pending: _Pending) -> bool:
        return len(_submitted(pending) | self._joined) == self.size

    def check_stall(self) -> bool:
        if self.stall is None or not self._table:  # (every cycle on rank 0: keep it cheap)
            return False
        return self.stall.check(self.waiting, self._joined)

    def _response(self, name: str, pending: _Pending) -> Response:
        shares = pending.shares
        if len(shares) == 1 and not self._joined and shares[0].varying is None:
            # Every rank in one group: nothing can differ, and nothing varies by rank.
            first = shares[0].request
            return Response(name, first.type, first.dtype, first.shape, first.reduce_op,
                            first.root_rank, first.prescale, first.postscale, first.device)
        first_share = min(shares, key=_lowest_rank)
        first = first_share.request
        error = self._validate(name, shares, first)
        if error is not None:
            return Response(name, first.type, dtype=first.dtype, error=error)
        shape, first_dims, splits = first.shape, None, None
        if first.type in (RequestType.ALLGATHER, RequestType.ALLTOALL):
            rows = np.zeros(self.size, dtype=np.int64)
            for share in shares:
                rows[share.ranks] = share.varying[:, 0]
            if shape:
                shape = (int(rows[first_share.ranks[0]]),) + shape[1:]
            if first.type == RequestType.ALLGATHER:
                first_dims = tuple(rows.tolist())
            else:
                splits = self._splits(shares, rows)
        return Response(
            name, first.type, dtype=first.dtype, shape=shape, reduce_op=first.reduce_op,
            root_rank=first.root_rank, prescale=first.prescale, postscale=first.postscale,
            device=first.device, first_dims=first_dims, splits=splits,
        )

    def _splits(self, shares: list[_Share], rows: np.ndarray) -> tuple[tuple[int, ...], ...]:
        """Every rank's send splits: its own, or its rows spread evenly."""
        table = np.empty((self.size, self.size), dtype=np.int64)
        for share in shares:
            if share.request.splits is not None:
                table[share.ranks] = share.varying[:, 1:]
            else:
                table[share.ranks] = (rows[share.ranks] // self.size)[:, None]
        return tuple(map(tuple, table.tolist()))

    def _validate(self, name: str, shares: list[_Share], first: Request) -> str | None:
        kind, opname = first.type, first.type.opname
        if len({share.request for share in shares}) > 1:
            for what, get in self._checks(kind):
                values = [(get(share.request), self._world[share.ranks]) for share in shares]
                if len({value for value, _ in values}) > 1:
                    op = opname if what != "collective" else "collective"
                    return (f"{op} of tensor '{name}': ranks disagree on the {what} "
                            f"({_describe(values)}). Every rank must submit the same "
                            f"{what} for a name.")
        if self._joined and kind != RequestType.ALLREDUCE:
            ranks = ", ".join(str(self.world_ranks[rank]) for rank in sorted(self._joined))
            return (f"{opname} of tensor '{name}' cannot run while ranks {ranks} have called "
                    "join(); only allreduce continues after a rank joins.")
        return None

    def _checks(self, kind: RequestType) -> list[tuple[str, Callable[[Request], object]]]:
        checks: list[tuple[str, Callable[[Request], object]]] = [
            ("collective", lambda r: r.type),
            ("dtype", lambda r: r.dtype),
            # "cuda" or "cuda/host": the class first (CPU against CUDA tensors), then
            # the path (NCCL on one rank, host staging on another: execution/cuda.py).
            ("device class", lambda r: r.device.partition("/")[0]),
            ("GPU path (HOROVODISH_GPU_OPERATIONS)", lambda r: r.device),
        ]
        if kind in (RequestType.ALLREDUCE, RequestType.REDUCESCATTER):
            checks += [("reduce op", lambda r: r.reduce_op),
                       ("prescale factor", lambda r: r.prescale),
                       ("postscale factor", lambda r: r.postscale)]
        if kind in (RequestType.ALLREDUCE, RequestType.BROADCAST, RequestType.REDUCESCATTER):
            checks.append(("shape", lambda r: r.shape))
        if kind in (RequestType.ALLGATHER, RequestType.ALLTOALL):
            checks += [("number of dimensions", lambda r: len(r.shape)),
                       ("shape after the first dimension", lambda r: r.shape[1:])]
        if kind == RequestType.BROADCAST:
            checks.append(("root rank", lambda r: self.world_ranks[r.root_rank]
                           if 0 <= r.root_rank < self.size else r.root_rank))
        if kind == RequestType.ALLTOALL:
            checks += [("use of explicit splits", lambda r: r.splits is not None),
                       ("number of splits", lambda r: r.splits[0] if r.splits else None)]
        return checks

"""The coordinator's decisions: count readiness, validate agreement, order responses.

Pure logic on rank 0's side of negotiation. It receives each rank's uncached requests,
and when every rank (joined ranks count as ready for allreduce) has submitted a name it
emits one response for it; if the ranks disagree, an error response that names the
tensor, the op and exactly what differed.
"""
from __future__ import annotations

from typing import Callable, Iterable, Sequence

from ..messages import ReduceOp, Request, RequestType, Response
from ..stall import StallInspector
from ..timeline import Timeline

JOIN_NAME = "join"


def _describe(values: dict[int, object]) -> str:
    """'rank 0: float32; ranks 1, 2: float64' — values grouped by rank."""
    groups: dict[str, list[int]] = {}
    for rank, value in sorted(values.items()):
        groups.setdefault(_format(value), []).append(rank)
    parts = []
    for text, ranks in groups.items():
        label = "rank" if len(ranks) == 1 else "ranks"
        parts.append(f"{label} {', '.join(map(str, ranks))}: {text}")
    return "; ".join(parts)


def _format(value: object) -> str:
    if isinstance(value, RequestType):
        return value.opname
    if isinstance(value, ReduceOp):
        return value.name.capitalize()
    if isinstance(value, tuple):
        return "(" + ", ".join(map(str, value)) + ("," if len(value) == 1 else "") + ")"
    return str(value)


def _check_same(name: str, opname: str, what: str, values: dict[int, object]) -> str | None:
    if len(set(values.values())) <= 1:
        return None
    return (f"{opname} of tensor '{name}': ranks disagree on the {what} "
            f"({_describe(values)}). Every rank must submit the same {what} for a name.")


class Coordinator:
    def __init__(self, world_ranks: Sequence[int], stall: StallInspector | None = None) -> None:
        self.size = len(world_ranks)
        # Messages name world ranks: inside a process set, set rank i is world_ranks[i].
        self.world_ranks = list(world_ranks)
        self.stall = stall
        self._table: dict[str, dict[int, Request]] = {}
        self._joined: set[int] = set()
        self._last_joined = -1

    @property
    def waiting(self) -> dict[str, set[int]]:
        return {name: set(by_rank) for name, by_rank in self._table.items()}

    @property
    def joined(self) -> set[int]:
        return set(self._joined)

    def add(self, rank: int, requests: Iterable[Request], timeline: Timeline | None = None
            ) -> None:
        for request in requests:
            if request.type == RequestType.JOIN:
                self._joined.add(rank)
                self._last_joined = rank
                continue
            self._table.setdefault(request.name, {})[rank] = request
            if self.stall is not None:
                self.stall.seen(request.name)
            if timeline is not None and rank != 0:  # rank 0 marks itself at submit
                timeline.negotiate_start(request.name, request.type.opname)
                timeline.rank_ready(request.name, rank)

    def ready_responses(self) -> list[Response]:
        """Responses for every name all ranks have, in the order names first arrived."""
        responses = []
        for name in list(self._table):
            by_rank = self._table[name]
            if all(rank in by_rank or rank in self._joined for rank in range(self.size)):
                del self._table[name]
                if self.stall is not None:
                    self.stall.done(name)
                responses.append(self._response(name, by_rank))
        if self._joined and len(self._joined) == self.size:
            responses.append(Response(JOIN_NAME, RequestType.JOIN, last_joined=self._last_joined))
            self._joined.clear()
        return responses

    def check_stall(self) -> bool:
        if self.stall is None or not self._table:  # (every cycle on rank 0: keep it cheap)
            return False
        return self.stall.check(self.waiting, self._joined)

    def _response(self, name: str, by_rank: dict[int, Request]) -> Response:
        error = self._validate(name, by_rank)
        first = by_rank[min(by_rank)]
        if error is not None:
            return Response(name, first.type, dtype=first.dtype, error=error)
        first_dims = splits = None
        if first.type == RequestType.ALLGATHER:
            first_dims = tuple(by_rank[rank].shape[0] for rank in range(self.size))
        elif first.type == RequestType.ALLTOALL:
            splits = tuple(_splits_of(by_rank[rank], self.size) for rank in range(self.size))
        return Response(
            name, first.type, dtype=first.dtype, shape=first.shape, reduce_op=first.reduce_op,
            root_rank=first.root_rank, prescale=first.prescale, postscale=first.postscale,
            device=first.device, first_dims=first_dims, splits=splits,
        )

    def _validate(self, name: str, by_rank: dict[int, Request]) -> str | None:
        first = by_rank[min(by_rank)]
        opname = first.type.opname
        field: Callable[[Callable[[Request], object]], dict[int, object]] = (
            lambda get: {self.world_ranks[rank]: get(req) for rank, req in by_rank.items()})
        checks: list[tuple[str, Callable[[Request], object]]] = [
            ("collective", lambda r: r.type),
            ("dtype", lambda r: r.dtype),
            # "cuda" or "cuda/host": the class first (CPU against CUDA tensors), then
            # the path (NCCL on one rank, host staging on another: execution/cuda.py).
            ("device class", lambda r: r.device.partition("/")[0]),
            ("GPU path (HOROVODISH_GPU_OPERATIONS)", lambda r: r.device),
        ]
        kind = first.type
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
            checks.append(("use of explicit splits", lambda r: r.splits is not None))
        for what, get in checks:
            error = _check_same(name, opname if what != "collective" else "collective",
                                what, field(get))
            if error is not None:
                return error
        if self._joined and kind != RequestType.ALLREDUCE:
            ranks = ", ".join(str(self.world_ranks[rank]) for rank in sorted(self._joined))
            return (f"{opname} of tensor '{name}' cannot run while ranks {ranks} have called "
                    "join(); only allreduce continues after a rank joins.")
        return None


def _splits_of(request: Request, size: int) -> tuple[int, ...]:
    if request.splits is not None:
        return request.splits
    rows = request.shape[0] if request.shape else 0
    return tuple([rows // size] * size)

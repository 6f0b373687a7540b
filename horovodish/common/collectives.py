"""Submitting collectives on numpy views: naming, validation and handles, for every adapter.

Adapters convert framework tensors to numpy views (zero-copy on the host) and call these;
everything that can be checked on one rank is checked here, before anything is sent,
so bad input raises at the call site rather than as a distributed failure.
"""
from __future__ import annotations

import itertools
from collections import defaultdict
from typing import Callable, Sequence

import numpy as np

from . import basics
from .dtypes import check_reduction, dtype_name
from .entry import Entry
from .handles import Handle
from .messages import ReduceOp, Request, RequestType

Allocator = Callable[[tuple[int, ...]], np.ndarray]

_counters: dict[str, itertools.count] = defaultdict(itertools.count)


def auto_name(opname: str) -> str:
    """Unnamed ops get per-process counters; every rank calls them in the same order."""
    return f"{opname}.noname.{next(_counters[opname])}"


def _submit(entries: list[Entry]) -> list[Handle]:
    basics.state().runtime.submit(entries)
    return [entry.handle for entry in entries]


def _handle(name: str) -> Handle:
    return Handle(name, basics.state().runtime.kick)


def _request(kind: RequestType, name: str, tensor: np.ndarray, device: str, **fields) -> Request:
    return Request(name, kind, dtype_name(tensor.dtype), tensor.shape, device=device, **fields)


def reduction_request(kind: RequestType, name: str, tensor: np.ndarray, op: ReduceOp,
                      prescale: float, postscale: float, device: str) -> Request:
    request = _request(kind, name, tensor, device, reduce_op=op, prescale=prescale,
                       postscale=postscale)
    if request.dtype == "bool":
        check_reduction(request.dtype, op, prescale, postscale, kind.opname, name)
    return request


def _reduction_args(kind: RequestType, op: ReduceOp, prescale: float, postscale: float,
                    first_name: str) -> tuple[ReduceOp, float, float]:
    """Normalise and check the arguments shared by a whole group, once per call."""
    op = ReduceOp(op)
    if op == ReduceOp.ADASUM:
        raise NotImplementedError(f"{kind.opname} of tensor '{first_name}': op Adasum is not "
                                  "implemented yet; use Average or Sum.")
    return op, float(prescale), float(postscale)


def grouped_allreduce_async(tensors: Sequence[np.ndarray], outputs: Sequence[np.ndarray],
                            names: Sequence[str], op: ReduceOp, prescale: float = 1.0,
                            postscale: float = 1.0, device: str = "cpu") -> list[Handle]:
    """Allreduce several tensors; they enter negotiation in the same cycle, so they fuse."""
    kick = basics.state().runtime.kick
    kind = RequestType.ALLREDUCE
    op, prescale, postscale = _reduction_args(kind, op, prescale, postscale,
                                              names[0] if names else "")
    entries = [
        Entry(reduction_request(kind, name, tensor, op, prescale, postscale, device), tensor,
              Handle(name, kick), output=output)
        for tensor, output, name in zip(tensors, outputs, names)
    ]
    return _submit(entries)


def allreduce_async(tensor: np.ndarray, output: np.ndarray, name: str, op: ReduceOp,
                    prescale: float = 1.0, postscale: float = 1.0,
                    device: str = "cpu") -> Handle:
    return grouped_allreduce_async([tensor], [output], [name], op, prescale, postscale, device)[0]


def grouped_allgather_async(tensors: Sequence[np.ndarray], allocators: Sequence[Allocator],
                            names: Sequence[str], device: str = "cpu") -> list[Handle]:
    basics.state()
    entries = []
    for tensor, allocate, name in zip(tensors, allocators, names):
        if tensor.ndim == 0:
            raise ValueError(f"allgather of tensor '{name}': a 0-dim tensor has no first "
                             "dimension to gather along; reshape it to (1,).")
        entries.append(Entry(_request(RequestType.ALLGATHER, name, tensor, device), tensor,
                             _handle(name), allocate=allocate))
    return _submit(entries)


def allgather_async(tensor: np.ndarray, allocate: Allocator, name: str,
                    device: str = "cpu") -> Handle:
    return grouped_allgather_async([tensor], [allocate], [name], device)[0]


def broadcast_async(tensor: np.ndarray, output: np.ndarray, root_rank: int, name: str,
                    device: str = "cpu") -> Handle:
    state = basics.state()
    if not 0 <= int(root_rank) < state.size:
        raise ValueError(f"broadcast of tensor '{name}': root_rank {root_rank} is out of range "
                         f"for {state.size} ranks (valid: 0..{state.size - 1}).")
    request = _request(RequestType.BROADCAST, name, tensor, device, root_rank=int(root_rank))
    return _submit([Entry(request, tensor, _handle(name), output=output)])[0]


def alltoall_async(tensor: np.ndarray, splits: Sequence[int] | None, allocate: Allocator,
                   name: str, device: str = "cpu") -> Handle:
    size = basics.state().size
    if tensor.ndim == 0:
        raise ValueError(f"alltoall of tensor '{name}': a 0-dim tensor cannot be split; "
                         "reshape it to (1,).")
    rows = tensor.shape[0]
    if splits is None:
        if rows % size:
            raise ValueError(f"alltoall of tensor '{name}': first dimension {rows} is not "
                             f"divisible by {size} ranks; pass splits= to send uneven parts.")
        split_tuple = None
    else:
        split_tuple = tuple(int(s) for s in splits)
        if len(split_tuple) != size:
            raise ValueError(f"alltoall of tensor '{name}': splits has {len(split_tuple)} "
                             f"entries but there are {size} ranks; give one count per rank.")
        if any(s < 0 for s in split_tuple) or sum(split_tuple) != rows:
            raise ValueError(f"alltoall of tensor '{name}': splits {list(split_tuple)} must be "
                             f"non-negative and sum to the first dimension {rows}.")
    request = _request(RequestType.ALLTOALL, name, tensor, device, splits=split_tuple)
    return _submit([Entry(request, tensor, _handle(name), allocate=allocate)])[0]


def reducescatter_shape(shape: Sequence[int], rank: int, size: int) -> tuple[int, ...]:
    """This rank's output shape: first dims split as evenly as possible, low ranks first."""
    rows = shape[0]
    base, extra = divmod(rows, size)
    return (base + (1 if rank < extra else 0),) + tuple(shape[1:])


def grouped_reducescatter_async(tensors: Sequence[np.ndarray], outputs: Sequence[np.ndarray],
                                names: Sequence[str], op: ReduceOp, prescale: float = 1.0,
                                postscale: float = 1.0, device: str = "cpu") -> list[Handle]:
    basics.state()
    entries = []
    for tensor, output, name in zip(tensors, outputs, names):
        if tensor.ndim == 0:
            raise ValueError(f"reducescatter of tensor '{name}': a 0-dim tensor cannot be "
                             "scattered; reshape it to (1,).")
        op, prescale, postscale = _reduction_args(RequestType.REDUCESCATTER, op, prescale,
                                                  postscale, name)
        request = reduction_request(RequestType.REDUCESCATTER, name, tensor, op, prescale,
                                    postscale, device)
        entries.append(Entry(request, tensor, _handle(name), output=output))
    return _submit(entries)


def barrier_async() -> Handle:
    name = auto_name("barrier")
    request = Request(name=name, type=RequestType.BARRIER, dtype="uint8", shape=())
    return _submit([Entry(request, None, _handle(name))])[0]


def join_async() -> Handle:
    from .coordinator import JOIN_NAME
    request = Request(name=JOIN_NAME, type=RequestType.JOIN, dtype="uint8", shape=())
    return _submit([Entry(request, None, _handle(JOIN_NAME))])[0]

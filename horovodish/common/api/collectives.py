"""Submitting collectives on numpy views: naming, validation and handles, for every adapter.

Adapters convert framework tensors to numpy views (zero-copy on the host) and call these;
everything that can be checked on one rank is checked here, before anything is sent,
so bad input raises at the call site rather than as a distributed failure.
"""
from __future__ import annotations

import itertools
from collections import defaultdict
from typing import Any, Callable, Sequence

import numpy as np

from .process_state import rank, state
from ..execution.backends.adasum import is_power_of_two
from ..dtypes import check_reduction, dtype_name, known_dtype_name
from ..errors import NotAMemberError
from ..execution.cuda import device_for
from ..entry import Entry
from ..handles import Handle
from ..messages import ReduceOp, Request, RequestType
from .process_sets import ProcessSet, global_process_set

Allocator = Callable[[tuple[int, ...]], np.ndarray]

# Enum members read through the class cost a lookup each, on a path of a few us.
_ALLREDUCE = RequestType.ALLREDUCE
_ADASUM = ReduceOp.ADASUM
_new_tuple = tuple.__new__

_counters: dict[tuple[str, int], itertools.count] = defaultdict(itertools.count)


def auto_name(opname: str, process_set: ProcessSet | None = None) -> str:
    """Unnamed ops get per-process counters, one per process set, so ranks outside a set
    do not fall out of step; every member calls them in the same order."""
    set_id = 0 if process_set is None else (process_set.process_set_id or 0)
    prefix = opname if set_id == 0 else f"ps{set_id}.{opname}"
    return f"{prefix}.noname.{next(_counters[(opname, set_id)])}"


def cuda_device(kind: RequestType, dtype: str, op: ReduceOp | None = None) -> str:
    """The device string for a CUDA tensor's request: "cuda" where the adapter passes
    CuPy views of its memory (NCCL), "cuda/host" where it stages it through host memory
    (execution/cuda.py). Decided by init()'s choice, the call and the dtype alone, so
    the same on every rank."""
    return device_for(state().gpu, kind, dtype, op)


def reset_auto_names(set_id: int | None = None) -> None:
    """Number unnamed ops from 0 again: init() does for every set, as every rank
    re-initializes, and removing a set does for its id, which a later set with other
    members may take (as in Horovod)."""
    if set_id is None:
        _counters.clear()
        return
    for key in [key for key in _counters if key[1] == set_id]:
        del _counters[key]


def resolve(process_set: ProcessSet | None) -> ProcessSet:
    """The set a call runs on; a clear error for a set this rank is not in."""
    state()
    if process_set is None or process_set is global_process_set:
        return global_process_set
    process_set._require_registered()
    if process_set.runtime is None:
        record = state().process_sets.get(process_set.process_set_id)
        if record is None or record.ranks != process_set.ranks:
            raise ValueError(f"{process_set!r} is not a registered process set (its id "
                             "was set by hand, or it was removed); register it with "
                             "hvd.init(process_sets=...) or hvd.add_process_set().")
        raise NotAMemberError(f"rank {rank()} is not a member of process set "
                              f"{process_set.ranks}; only its members may run collectives "
                              "on it.")
    return process_set


def _require_first_dim(tensor: np.ndarray, opname: str, name: str) -> None:
    if tensor.ndim == 0:
        raise ValueError(f"{opname} of tensor '{name}': a 0-dim tensor has no first dimension "
                         "to split or gather along; reshape it to (1,).")


def _check_output(tensor: np.ndarray, output: np.ndarray | None, opname: str,
                  name: str) -> None:
    """An output must match its input: results are copied into it without checks."""
    if output is not None and output is not tensor and (
            output.shape != tensor.shape or output.dtype != tensor.dtype):
        raise ValueError(
            f"{opname} of tensor '{name}': the output has shape {tuple(output.shape)} and "
            f"dtype {output.dtype} but the input has shape {tuple(tensor.shape)} and dtype "
            f"{tensor.dtype}; they must match.")


def _submit(entries: list[Entry], process_set: ProcessSet, waited: bool = False
            ) -> list[Handle]:
    """waited: the caller waits on the handles at once (Runtime.submit_one)."""
    process_set.runtime.submit(entries, waited)
    return entries


def _request(kind: RequestType, name: str, tensor: np.ndarray, device: str, **fields) -> Request:
    return Request(name, kind, dtype_name(tensor.dtype), tensor.shape, device=device, **fields)


def reduction_request(kind: RequestType, name: str, tensor: np.ndarray, op: ReduceOp,
                      prescale: float, postscale: float, device: str) -> Request:
    # All ten fields through tuple.__new__: one request is built per submitted tensor.
    dtype = known_dtype_name(tensor.dtype) or dtype_name(tensor.dtype)
    if dtype == "bool" or op is _ADASUM:  # op is a member here
        check_reduction(dtype, op, prescale, postscale, kind.opname, name)
    return _new_tuple(Request, (name, kind, dtype, tensor.shape, op, -1, prescale, postscale,
                                device, None))


def _reduction_args(kind: RequestType, op: ReduceOp, prescale: float, postscale: float,
                    first_name: str, process_set: ProcessSet) -> tuple[ReduceOp, float, float]:
    """Normalise and check the arguments shared by a whole group, once per call."""
    if type(op) is not ReduceOp:  # the enum call costs more than the rest of a submit
        op = ReduceOp(op)
    if op is _ADASUM:
        size = process_set.size()
        if kind != RequestType.ALLREDUCE:
            raise NotImplementedError(f"{kind.opname} of tensor '{first_name}': op Adasum "
                                      "is only defined for allreduce.")
        if not is_power_of_two(size):
            raise ValueError(f"allreduce of tensor '{first_name}': op Adasum needs a "
                             f"power-of-two number of ranks, not {size}.")
    if type(prescale) is not float or type(postscale) is not float:
        prescale, postscale = float(prescale), float(postscale)
    return op, prescale, postscale


def grouped_allreduce_async(tensors: Sequence[np.ndarray],
                            outputs: Sequence[np.ndarray | None],
                            names: Sequence[str], op: ReduceOp, prescale: float = 1.0,
                            postscale: float = 1.0, device: str = "cpu",
                            process_set: ProcessSet | None = None,
                            event: Any = None, waited: bool = False) -> list[Handle]:
    """Allreduce several tensors; they enter negotiation in the same cycle, so they fuse.

    An output of None lets the runtime own the result: the handle returns a view of a
    runtime block (valid for as long as the caller keeps it; saves a copy). event: for
    CUDA views, the ready event recorded on the caller's stream (cuda_streams.py)."""
    process_set = resolve(process_set)
    completions = process_set.runtime.completions
    kind = _ALLREDUCE
    op, prescale, postscale = _reduction_args(kind, op, prescale, postscale,
                                              names[0] if names else "", process_set)
    entries = []
    for tensor, output, name in zip(tensors, outputs, names):
        if output is not tensor:
            _check_output(tensor, output, "allreduce", name)
        entries.append(Entry(reduction_request(kind, name, tensor, op, prescale, postscale,
                                               device), tensor, completions, output,
                             event=event))
    return _submit(entries, process_set, waited)


def allreduce_async(tensor: np.ndarray, output: np.ndarray | None, name: str, op: ReduceOp,
                    prescale: float = 1.0, postscale: float = 1.0, device: str = "cpu",
                    process_set: ProcessSet | None = None, event: Any = None,
                    waited: bool = False) -> Handle:
    """waited: the caller waits on the handle at once (a blocking call): the runtime
    thread is not set to run it meanwhile (``Runtime.submit_one``)."""
    # The grouped call for one tensor, without its lists: bursts of single submits are
    # the pattern to be fast for (docs/tuning.md), so the common case skips calls.
    if (process_set is None or process_set is global_process_set) and \
            global_process_set.runtime is not None:
        process_set = global_process_set  # initialized, global set: what resolve() would say
    else:
        process_set = resolve(process_set)
    if output is not tensor and output is not None:
        _check_output(tensor, output, "allreduce", name)
    if type(op) is not ReduceOp or op is _ADASUM or type(prescale) is not float \
            or type(postscale) is not float:  # else already normalised: skip the call
        op, prescale, postscale = _reduction_args(_ALLREDUCE, op, prescale, postscale, name,
                                                  process_set)
    runtime = process_set.runtime
    entry = Entry(reduction_request(_ALLREDUCE, name, tensor, op, prescale, postscale, device),
                  tensor, runtime.completions, output, event=event)
    runtime.submit_one(entry, name, waited)
    return entry


def grouped_allgather_async(tensors: Sequence[np.ndarray],
                            allocators: Sequence[Allocator | None],
                            names: Sequence[str], device: str = "cpu",
                            process_set: ProcessSet | None = None,
                            event: Any = None, waited: bool = False) -> list[Handle]:
    """An allocator None: the result is a view of a runtime-owned block (host memory)."""
    process_set = resolve(process_set)
    completions = process_set.runtime.completions
    entries = []
    for tensor, allocate, name in zip(tensors, allocators, names):
        _require_first_dim(tensor, "allgather", name)
        entries.append(Entry(_request(RequestType.ALLGATHER, name, tensor, device), tensor,
                             completions, allocate=allocate, event=event))
    return _submit(entries, process_set, waited)


def allgather_async(tensor: np.ndarray, allocate: Allocator | None, name: str,
                    device: str = "cpu", process_set: ProcessSet | None = None,
                    event: Any = None, waited: bool = False) -> Handle:
    return grouped_allgather_async([tensor], [allocate], [name], device, process_set,
                                   event, waited)[0]


def broadcast_async(tensor: np.ndarray, output: np.ndarray | None, root_rank: int, name: str,
                    device: str = "cpu", process_set: ProcessSet | None = None,
                    event: Any = None, waited: bool = False) -> Handle:
    """root_rank is a world rank (as in Horovod), also for a process set. output None:
    the result is a view of a runtime-owned block (host memory only)."""
    process_set = resolve(process_set)
    size = state().size
    if not 0 <= int(root_rank) < size:
        raise ValueError(f"broadcast of tensor '{name}': root_rank {root_rank} is out of range "
                         f"for {size} ranks (valid: 0..{size - 1}).")
    root = process_set.set_rank_of(int(root_rank), f"broadcast of tensor '{name}': root_rank")
    _check_output(tensor, output, "broadcast", name)
    request = _request(RequestType.BROADCAST, name, tensor, device, root_rank=root)
    entry = Entry(request, tensor, process_set.runtime.completions, output=output,
                  event=event)
    return _submit([entry], process_set, waited)[0]


def alltoall_async(tensor: np.ndarray, splits: Sequence[int] | None,
                   allocate: Allocator | None, name: str, device: str = "cpu",
                   process_set: ProcessSet | None = None, event: Any = None,
                   waited: bool = False) -> Handle:
    """allocate None: the result is a view of a runtime-owned block (host memory). The
    handle returns (output, the rows received from each rank)."""
    process_set = resolve(process_set)
    size = process_set.size()
    _require_first_dim(tensor, "alltoall", name)
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
    entry = Entry(request, tensor, process_set.runtime.completions, allocate=allocate,
                  event=event)
    return _submit([entry], process_set, waited)[0]


def reducescatter_shape(shape: Sequence[int], rank: int, size: int) -> tuple[int, ...]:
    """This rank's output shape: first dims split as evenly as possible, low ranks first."""
    rows = shape[0]
    base, extra = divmod(rows, size)
    return (base + (1 if rank < extra else 0),) + tuple(shape[1:])


def grouped_reducescatter_async(tensors: Sequence[np.ndarray],
                                outputs: Sequence[np.ndarray | None],
                                names: Sequence[str], op: ReduceOp, prescale: float = 1.0,
                                postscale: float = 1.0, device: str = "cpu",
                                process_set: ProcessSet | None = None,
                                event: Any = None, waited: bool = False) -> list[Handle]:
    """An output None: the result is a view of a runtime-owned block (host memory)."""
    process_set = resolve(process_set)
    completions = process_set.runtime.completions
    entries = []
    for tensor, output, name in zip(tensors, outputs, names):
        _require_first_dim(tensor, "reducescatter", name)
        op, prescale, postscale = _reduction_args(RequestType.REDUCESCATTER, op, prescale,
                                                  postscale, name, process_set)
        request = reduction_request(RequestType.REDUCESCATTER, name, tensor, op, prescale,
                                    postscale, device)
        entries.append(Entry(request, tensor, completions, output=output, event=event))
    return _submit(entries, process_set, waited)


def barrier_async(process_set: ProcessSet | None = None) -> Handle:
    process_set = resolve(process_set)
    name = auto_name("barrier", process_set)
    request = Request(name=name, type=RequestType.BARRIER, dtype="uint8", shape=())
    return _submit([Entry(request, None, process_set.runtime.completions)],
                   process_set)[0]


def join_async() -> Handle:
    """Join runs on the global set (as in Horovod)."""
    from ..negotiation.coordinator import JOIN_NAME
    process_set = resolve(None)
    request = Request(name=JOIN_NAME, type=RequestType.JOIN, dtype="uint8", shape=())
    return _submit([Entry(request, None, process_set.runtime.completions)],
                   process_set)[0]

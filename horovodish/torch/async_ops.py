"""The asynchronous torch collectives and their handles: the adapter's bottom layer.

Each call converts tensors to numpy views, submits them to the core, and returns an
integer handle (as Horovod does); ``synchronize(handle)`` waits and returns torch tensors.
Nothing here knows autograd: ``autograd.py`` builds the differentiable blocking forms
on top of these, and ``mpi_ops.py`` (Horovod's module) puts both together.
"""
from __future__ import annotations

import itertools
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ..common.api import collectives as core
from ..common.runtime.handles import Handle
from ..common.messages import ReduceOp, RequestType
from ..common.api.process_sets import ProcessSet, global_process_set
from ..common.execution.cuda import DEVICE_CUDA
from . import tensor_views
from .tensor_views import (as_cuda_view, as_numpy, check_tensor, device_class, empty_allocator,
                           from_cuda_view, from_cuda_views, from_numpy, on_device, ready_event,
                           wait_on_current_stream)

from ..common.messages import Adasum, Average, Max, Min, Product, Sum  # noqa: F401
from ..common.messages import resolve_op as _resolve_op

# Integer handle -> (core handles, what turns their results into the caller's return),
# or, for the single-tensor short path, (the core handle, the tensor to return): one
# tuple per call instead of a tuple, a list and a closure (fewer objects for the
# garbage collector, whose young-generation passes a 256-tensor burst would trigger).
# No lock: under CPython's GIL next() on a count and single dict operations are
# atomic, and each is all that registering or claiming a handle takes (a lock was a
# measurable share of each call).
_handle_ids = itertools.count()
_handles: dict[int, tuple[list[Handle], Callable[[list[Any]], Any]] | tuple[Handle, Any]] = {}


def register(handles: list[Handle] | Handle, finish: Any) -> int:
    """A new integer handle for core handles and what turns their results into the
    caller's return value."""
    handle_id = next(_handle_ids)
    _handles[handle_id] = (handles, finish)
    return handle_id


def _issued() -> int:
    """How many handles were issued so far (without using one up)."""
    return int(repr(_handle_ids)[len("count("):-1])  # e.g. "count(7)"; rare path only


def take(handle: int) -> tuple[list[Handle], Callable[[list[Any]], Any]]:
    """Unregister handle and return its core handles and finish, to build another
    operation from them (sparse allreduce combines two allgathers)."""
    return _handles.pop(handle)


def _unknown(handle: int) -> ValueError:
    return ValueError(f"handle {handle} is unknown or was already synchronized")


def poll(handle: int) -> bool:
    """True when the operation behind handle has finished (synchronize will not block)."""
    registered = _handles.get(handle)
    if registered is None:
        raise _unknown(handle)
    handles = registered[0]
    return all(h.done() for h in handles) if type(handles) is list else handles.done()


def synchronize(handle: int) -> Any:
    """Wait for handle; returns the output tensor(s) or raises HorovodInternalError.
    The handle stays known (to poll from another thread) until the wait is over; a
    handle synchronized already gives None, as in Horovod (one never issued raises)."""
    registered = _handles.get(handle)
    if registered is None:
        if isinstance(handle, int) and 0 <= handle < _issued():
            return None
        raise _unknown(handle)
    handles, finish = registered
    try:
        if type(handles) is not list:  # a short path's (core handle, tensor or _OWNED)
            result = handles.wait()
            if finish is _OWNED:
                return torch.from_numpy(result)
            if type(finish) is _OnDevice:
                return finish.complete(handles, result)
            return finish
        results = [h.wait() for h in handles]
        # CUDA views (the NCCL path): entries carry completion events; other handles
        # (plain Handle objects, in tests) have none.
        if handles and getattr(handles[0], "event", None) is not None:
            _stream_waits_for(handles)
        return finish(results)
    finally:
        _handles.pop(handle, None)


# The short path's finish for an out-of-place allreduce: the result is the runtime's
# (a view of a result block, reused once the caller drops it), made a tensor at synchronize.
_OWNED = object()


class _OnDevice:
    """The finish of one CUDA tensor's short path (_allreduce_on_device): the caller's
    current stream waits for the result, which is the tensor itself (in place) or a
    view of the runtime's block. Holding the tensor keeps its memory from the caching
    allocator until then: the collective's stream may still be reading it."""
    __slots__ = ("tensor", "in_place")

    def __init__(self, tensor: torch.Tensor, in_place: bool) -> None:
        self.tensor = tensor
        self.in_place = in_place

    def complete(self, handle: Handle, result: Any) -> torch.Tensor:
        wait_on_current_stream(handle.event)
        if self.in_place:
            return self.tensor
        return from_cuda_view(result, self.tensor.dtype)


_DTYPE_NAMES = {dtype: str(dtype)[len("torch."):] for dtype in tensor_views.SUPPORTED}


def _allreduce_on_device(tensor: torch.Tensor, in_place: bool, name: str | None,
                         op: ReduceOp, prescale_factor: float, postscale_factor: float,
                         process_set: ProcessSet) -> int | None:
    """One contiguous CUDA tensor on the NCCL path, straight to the core's single-tensor
    submit, as _allreduce_plain does for host memory; None: take the general path. (On
    an H100 the general path's Python was half of a small call's host time.)"""
    dtype = _DTYPE_NAMES.get(tensor.dtype)
    if dtype is None or not tensor.is_contiguous() or \
            core.cuda_device(RequestType.ALLREDUCE, dtype, op) != DEVICE_CUDA:
        return None
    view = as_cuda_view(tensor)
    return register(core.allreduce_async(
        view, view if in_place else None, names_for(name, 1, "allreduce", process_set)[0],
        op, prescale_factor, postscale_factor, DEVICE_CUDA, process_set,
        ready_event(tensor)), _OnDevice(tensor, in_place))


def _stream_waits_for(handles: list[Handle]) -> None:
    """The caller's current stream waits for the results on the device (each group's
    completion event once): the host does not wait for the GPU."""
    seen: set[int] = set()
    for h in handles:
        event = getattr(h, "event", None)
        if event is not None and id(event.event) not in seen:
            seen.add(id(event.event))
            wait_on_current_stream(event)


def _plain_array(tensor: Any) -> np.ndarray | None:
    """The numpy view of a tensor that needs no conversion (a contiguous CPU tensor of a
    numpy dtype, outside autograd), else None: the single-tensor calls' short path."""
    if isinstance(tensor, torch.Tensor) and tensor.is_cpu and not tensor.requires_grad \
            and tensor.dtype in _NUMPY_DTYPES and tensor.is_contiguous():
        return tensor.numpy()
    return None


_NUMPY_DTYPES = frozenset({torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                           torch.float16, torch.float32, torch.float64, torch.bool})


class FinalName(str):
    """A name names_for made already: passed on as it is. Autograd names an op once and
    derives its backward's names from it ("<name>.grad"), which must not get a second
    op prefix."""
    __slots__ = ()


def names_for(name: str | Sequence[str] | None, count: int, opname: str,
              process_set: ProcessSet = global_process_set) -> list[str]:
    """One name per tensor, as Horovod's torch binding makes them: the op, then the given
    name ("allreduce.loss"; in a group of n, "grouped_allreduce.loss_1ofn" and on), so
    ops of different kinds may share a name, as in Horovod; unnamed ops (and name="")
    get "<op>.noname.<counter>". A grouped op may take a list of names (beyond Horovod),
    each "<op>.<name>", so that a tensor keeps the same name whether it is reduced alone
    or in a group."""
    if name is None or name == "":  # Horovod's binding reads an empty name as none
        return [core.auto_name(opname, process_set) for _ in range(count)]
    if type(name) is FinalName and count == 1:
        return [name]
    if isinstance(name, str):
        if count == 1:
            return [f"{opname}.{name}"]
        return [f"grouped_{opname}.{name}_{i}of{count}" for i in range(1, count + 1)]
    names = [n if type(n) is FinalName else f"{opname}.{n}" for n in name]
    if len(names) != count:
        raise ValueError(f"{opname}: got {len(names)} names for {count} tensors; pass "
                         "one name per tensor, or a single name for the group.")
    return names


# direct, below: the call's CUDA tensors go to the core as CuPy views of their memory
# (the NCCL path, tensor_views.on_device); otherwise CUDA tensors are staged.
def _contiguous(tensor: torch.Tensor, direct: bool = False) -> torch.Tensor:
    """A contiguous tensor with tensor's values where the core reads it: itself if it is
    one, else a copy (of a strided tensor, or in host memory of one on an accelerator
    that is staged: see staged)."""
    if not direct and tensor_views.staged(tensor):
        return tensor.detach().to("cpu", memory_format=torch.contiguous_format, copy=True)
    return tensor if tensor.is_contiguous() else tensor.contiguous()


def _result_like(tensor: torch.Tensor, direct: bool = False) -> torch.Tensor:
    """An empty contiguous tensor for tensor's result: on its device if direct, else
    on the host."""
    return torch.empty(tensor.shape, dtype=tensor.dtype,
                       device=tensor.device if direct else None)


def _back(result: torch.Tensor, like: torch.Tensor, direct: bool = False) -> torch.Tensor:
    """A result where the caller's tensor lives (a staged one's device)."""
    if not direct and tensor_views.staged(like):
        return result.to(like.device, copy=True)
    return result


def _view(tensor: torch.Tensor, direct: bool) -> Any:
    return as_cuda_view(tensor) if direct else as_numpy(tensor)


def _device(tensor: torch.Tensor, direct: bool) -> str:
    return DEVICE_CUDA if direct else device_class(tensor)


def _direct(tensors: Sequence[torch.Tensor], kind: RequestType, op: ReduceOp | None = None
            ) -> bool:
    """Whether this call takes the NCCL path (a CPU tensor costs one attribute read)."""
    return bool(tensors) and isinstance(tensors[0], torch.Tensor) and \
        tensors[0].is_cuda and on_device(list(tensors), kind, op)


def _write_back(tensors: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]
                ) -> Callable[[list[Any]], list[torch.Tensor]]:
    """Completion of an in-place op: a non-contiguous input got a contiguous stand-in,
    whose result is copied back into it."""
    def finish(_: list[Any]) -> list[torch.Tensor]:
        with torch.no_grad():  # as Horovod: an in-place collective is outside autograd
            for tensor, output in zip(tensors, outputs):
                if tensor.data_ptr() != output.data_ptr():
                    tensor.copy_(output)
        return list(tensors)
    return finish


# -- allreduce -----------------------------------------------------------------------------
def _grouped_allreduce_async(tensors: Sequence[torch.Tensor],
                             outputs: Sequence[torch.Tensor | None],
                             name: str | None, op: ReduceOp, prescale_factor: float,
                             postscale_factor: float, opname: str,
                             finish: Callable[[list[Any]], Any],
                             process_set: ProcessSet = global_process_set,
                             in_place: bool = False, direct: bool = False,
                             waited: bool = False) -> int:
    """in_place: each output is its tensor, or the contiguous host stand-in that finish
    writes back (then it is the input too: no second copy of the tensor)."""
    sources, targets = [], []
    kept = [] if direct else None
    for tensor, output in zip(tensors, outputs):  # one pass: this runs per tensor
        check_tensor(tensor, opname)
        if in_place:  # the very same array as input and output: the core skips a copy
            source = _view(output, direct)
            targets.append(source)
        else:  # no output: the runtime owns the result (a view of its block)
            contiguous = _contiguous(tensor, direct)
            if direct:  # device memory is read later, in stream order: keep it alive
                kept.append(contiguous)
            source = _view(contiguous, direct)
            targets.append(None if output is None else _view(output, direct))
        sources.append(source)
    names = names_for(name, len(tensors), "allreduce", process_set)
    device = _device(tensors[0], direct) if tensors else "cpu"
    event = ready_event(tensors[0]) if direct else None
    if len(sources) == 1:  # the core's single-tensor path: no group bookkeeping
        handles = [core.allreduce_async(sources[0], targets[0], names[0], op, prescale_factor,
                                        postscale_factor, device, process_set, event,
                                        waited=waited)]
    else:
        handles = core.grouped_allreduce_async(sources, targets, names, op, prescale_factor,
                                               postscale_factor, device, process_set, event,
                                               waited=waited)
    if kept:
        return register(handles, lambda results, _kept=kept: finish(results))
    return register(handles, finish)


def grouped_allreduce_async(tensors: Sequence[torch.Tensor], average: bool | None = None,
                            name: str | None = None, op: ReduceOp | None = None,
                            prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: ProcessSet = global_process_set, *,
                            waited: bool = False) -> int:
    return _grouped_allreduce_into_runtime(tensors, name, _resolve_op(average, op),
                                           prescale_factor, postscale_factor, process_set,
                                           waited=waited)


def grouped_allreduce_async_(tensors: Sequence[torch.Tensor], average: bool | None = None,
                             name: str | None = None, op: ReduceOp | None = None,
                             prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                             process_set: ProcessSet = global_process_set, *,
                             waited: bool = False) -> int:
    op = _resolve_op(average, op)
    direct = _direct(tensors, RequestType.ALLREDUCE, op)
    outputs = [_contiguous(t, direct) for t in tensors]
    return _grouped_allreduce_async(tensors, outputs, name, op,
                                    prescale_factor, postscale_factor, "grouped_allreduce_",
                                    _write_back(tensors, outputs), process_set, in_place=True,
                                    direct=direct, waited=waited)


def _allreduce_plain(array: np.ndarray, target: np.ndarray | None, result: Any,
                     name: str | Sequence[str] | None, op: ReduceOp, prescale_factor: float,
                     postscale_factor: float, process_set: ProcessSet) -> int:
    """One tensor that _plain_array could view, straight to the core's single-tensor
    submit (cheaper than the grouped path); the handle returns result (_OWNED: the
    runtime's result, target None)."""
    return register(core.allreduce_async(
        array, target, names_for(name, 1, "allreduce", process_set)[0], op, prescale_factor,
        postscale_factor, "cpu", process_set), result)


def allreduce_async(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                    op: ReduceOp | None = None, prescale_factor: float = 1.0,
                    postscale_factor: float = 1.0,
                    process_set: ProcessSet = global_process_set) -> int:
    op = _resolve_op(average, op)
    array = _plain_array(tensor)
    if array is not None:  # the result is the runtime's: no output to allocate or fill
        return _allreduce_plain(array, None, _OWNED, name, op, prescale_factor,
                                postscale_factor, process_set)
    if type(tensor) is torch.Tensor and tensor.is_cuda:
        handle = _allreduce_on_device(tensor, False, name, op, prescale_factor,
                                      postscale_factor, process_set)
        if handle is not None:
            return handle
    return _grouped_allreduce_into_runtime([tensor], name, op, prescale_factor,
                                           postscale_factor, process_set, single=True)


def allreduce_async_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                     op: ReduceOp | None = None, prescale_factor: float = 1.0,
                     postscale_factor: float = 1.0,
                     process_set: ProcessSet = global_process_set) -> int:
    op = _resolve_op(average, op)
    array = _plain_array(tensor)
    if array is not None:
        return _allreduce_plain(array, array, tensor, name, op, prescale_factor,
                                postscale_factor, process_set)
    if type(tensor) is torch.Tensor and tensor.is_cuda:
        handle = _allreduce_on_device(tensor, True, name, op, prescale_factor,
                                      postscale_factor, process_set)
        if handle is not None:
            return handle
    direct = _direct([tensor], RequestType.ALLREDUCE, op)
    output = _contiguous(tensor, direct)
    write_back = _write_back([tensor], [output])
    return _grouped_allreduce_async([tensor], [output], name, op, prescale_factor,
                                    postscale_factor, "allreduce_",
                                    lambda results: write_back(results)[0], process_set,
                                    in_place=True, direct=direct)


def grouped_allreduce_into_runtime_async(tensors: Sequence[torch.Tensor],
                                         name: str | Sequence[str] | None = None,
                                         op: ReduceOp = Average, prescale_factor: float = 1.0,
                                         postscale_factor: float = 1.0,
                                         process_set: ProcessSet = global_process_set) -> int:
    """Like grouped_allreduce_async, but the results are views of a runtime-owned block
    (beyond Horovod): the inputs are untouched and nothing is copied out of the fusion
    buffer. DistributedOptimizer uses it and installs the results as the gradients."""
    return _grouped_allreduce_into_runtime(tensors, name, ReduceOp(op), prescale_factor,
                                           postscale_factor, process_set)


def _grouped_allreduce_into_runtime(tensors: Sequence[torch.Tensor],
                                    name: str | Sequence[str] | None, op: ReduceOp,
                                    prescale_factor: float, postscale_factor: float,
                                    process_set: ProcessSet, single: bool = False,
                                    waited: bool = False) -> int:
    """The results are views of a runtime block: on the GPU for the NCCL path, else on
    the host (moved to the tensors' device, if staged). single: return the one result."""
    if _direct(tensors, RequestType.ALLREDUCE, op):  # views of a device result block
        def finish_device(results: list[Any]) -> Any:
            out = from_cuda_views(results, [t.dtype for t in tensors])
            return out[0] if single else out
        return _grouped_allreduce_async(
            tensors, [None] * len(tensors), name, op, prescale_factor, postscale_factor,
            "allreduce" if single else "grouped_allreduce", finish_device, process_set,
            direct=True, waited=waited)

    def finish_host(results: list[Any]) -> Any:
        out = _owned_results(results, tensors)
        return out[0] if single else out
    return _grouped_allreduce_async(tensors, [None] * len(tensors), name, op,
                                    prescale_factor, postscale_factor,
                                    "allreduce" if single else "grouped_allreduce",
                                    finish_host, process_set, waited=waited)


def allreduce_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
               op: ReduceOp | None = None, prescale_factor: float = 1.0,
               postscale_factor: float = 1.0,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    op = _resolve_op(average, op)
    array = _plain_array(tensor)
    if array is not None:  # waited on at once: no handle to register
        _allreduce_now(array, array, name, op, prescale_factor, postscale_factor, process_set)
        return tensor
    return synchronize(allreduce_async_(tensor, None, name, op, prescale_factor,
                                        postscale_factor, process_set))


def allreduce_plain_now(tensor: torch.Tensor, name: str | None, op: ReduceOp,
                        prescale_factor: float, postscale_factor: float,
                        process_set: ProcessSet) -> torch.Tensor | None:
    """The blocking out-of-place allreduce of a tensor _plain_array can view, as a view
    of the runtime's result block; None for any other tensor (then take the general
    path). Per-call Python is most of a small allreduce's time: this skips the handle."""
    array = _plain_array(tensor)
    if array is None:
        return None
    return torch.from_numpy(_allreduce_now(array, None, name, op, prescale_factor,
                                           postscale_factor, process_set))


def _allreduce_now(array: np.ndarray, target: np.ndarray | None, name: str | None,
                   op: ReduceOp, prescale_factor: float, postscale_factor: float,
                   process_set: ProcessSet) -> np.ndarray:
    return core.allreduce_async(array, target, names_for(name, 1, "allreduce", process_set)[0],
                                op, prescale_factor, postscale_factor, "cpu",
                                process_set, waited=True).wait()


def grouped_allreduce_(tensors: Sequence[torch.Tensor], average: bool | None = None,
                       name: str | None = None, op: ReduceOp | None = None,
                       prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set, waited=True))


# -- allgather -----------------------------------------------------------------------------
# waited (keyword, beyond Horovod): the caller synchronizes at once (the blocking forms),
# so the runtime's timer is not armed for the call (Runtime.submit_one).
def grouped_allgather_async(tensors: Sequence[torch.Tensor], name: str | None = None,
                            process_set: ProcessSet = global_process_set, *,
                            waited: bool = False) -> int:
    for tensor in tensors:
        check_tensor(tensor, "allgather")
    direct = _direct(tensors, RequestType.ALLGATHER)
    sources = [_contiguous(t, direct) for t in tensors]
    names = names_for(name, len(tensors), "allgather", process_set)
    device = _device(tensors[0], direct) if tensors else "cpu"
    if not direct:  # host memory: the results are views of runtime-owned blocks
        handles = core.grouped_allgather_async([as_numpy(t) for t in sources],
                                               [None] * len(tensors), names, device,
                                               process_set, waited=waited)
        return register(handles, lambda results, _kept=sources: _owned_results(results,
                                                                               tensors))
    outputs: list[list[torch.Tensor]] = [[] for _ in tensors]
    handles = core.grouped_allgather_async(
        [_view(t, direct) for t in sources],
        [empty_allocator(t, out, direct) for t, out in zip(sources, outputs)],
        names, device, process_set, ready_event(tensors[0]))
    return register(handles, lambda _, _kept=sources: [_back(out[0], t, direct)
                                                       for out, t in zip(outputs, tensors)])


def _owned_results(results: list[np.ndarray], tensors: Sequence[torch.Tensor]
                   ) -> list[torch.Tensor]:
    """Results in runtime-owned host blocks as tensors where the callers' live (a staged
    tensor's device gets a copy; the block is then free again)."""
    return [_back(from_numpy(result), tensor) for result, tensor in zip(results, tensors)]


def allgather_async(tensor: torch.Tensor, name: str | None = None,
                    process_set: ProcessSet = global_process_set, *,
                    waited: bool = False) -> int:
    handle = grouped_allgather_async([tensor], name, process_set, waited=waited)
    handles, finish = _handles[handle]
    _handles[handle] = (handles, lambda results: finish(results)[0])
    return handle


def allgather_into_async(tensor: torch.Tensor, output: torch.Tensor, name: str | None = None,
                         process_set: ProcessSet = global_process_set) -> int:
    """allgather into a given contiguous output of the gathered shape (beyond Horovod):
    the sharded optimizer gathers updated shards straight into the flat parameters.
    tensor may be this rank's part of output (then gathered in place); otherwise it
    must not overlap output. synchronize returns output."""
    check_tensor(tensor, "allgather")
    if tensor_views.staged(output):  # via host memory, then into output
        handle = grouped_allgather_async([tensor], name, process_set)
        handles, finish = _handles[handle]
        _handles[handle] = (handles, lambda results: output.copy_(finish(results)[0]))
        return handle

    def allocate(shape: tuple[int, ...]) -> np.ndarray:
        if tuple(shape) != tuple(output.shape):
            raise ValueError(f"allgather into an output of shape {list(output.shape)}: the "
                             f"gathered tensor has shape {list(shape)}")
        return as_numpy(output)
    source = _contiguous(tensor)
    handles = core.grouped_allgather_async(
        [as_numpy(source)], [allocate], names_for(name, 1, "allgather", process_set),
        device_class(tensor), process_set)
    return register(handles, lambda _: output)


# -- broadcast -----------------------------------------------------------------------------
def _broadcast_async(tensor: torch.Tensor, output: torch.Tensor | None, root_rank: int,
                     name: str | None, finish: Callable[[list[Any]], Any],
                     process_set: ProcessSet = global_process_set,
                     in_place: bool = False, direct: bool = False,
                     waited: bool = False) -> int:
    """in_place: output is tensor or its host stand-in (see _grouped_allreduce_async).
    output None: the runtime's (host memory)."""
    check_tensor(tensor, "broadcast")
    kept = None
    if in_place:
        source = target = _view(output, direct)
    else:
        kept = _contiguous(tensor, direct)
        source = _view(kept, direct)
        target = None if output is None else _view(output, direct)
    handle = core.broadcast_async(source, target, root_rank,
                                  names_for(name, 1, "broadcast", process_set)[0],
                                  _device(tensor, direct), process_set,
                                  ready_event(tensor) if direct else None, waited=waited)
    return register([handle], (lambda results, _kept=kept: finish(results)) if direct
                    else finish)


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                    process_set: ProcessSet = global_process_set, *,
                    waited: bool = False) -> int:
    direct = _direct([tensor], RequestType.BROADCAST)
    if not direct:  # host memory: the result is a view of a runtime-owned block
        return _broadcast_async(tensor, None, root_rank, name,
                                lambda results: _owned_results(results, [tensor])[0],
                                process_set, waited=waited)
    output = _result_like(tensor, direct)
    return _broadcast_async(tensor, output, root_rank, name,
                            lambda _: _back(output, tensor, direct), process_set,
                            direct=direct)


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                     process_set: ProcessSet = global_process_set, *,
                     waited: bool = False) -> int:
    direct = _direct([tensor], RequestType.BROADCAST)
    output = _contiguous(tensor, direct)
    write_back = _write_back([tensor], [output])
    return _broadcast_async(tensor, output, root_rank, name,
                            lambda results: write_back(results)[0], process_set,
                            in_place=True, direct=direct, waited=waited)


def broadcast_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set, waited=True))


# -- alltoall ------------------------------------------------------------------------------
def alltoall_async(tensor: torch.Tensor, splits: Any = None, name: str | None = None,
                   process_set: ProcessSet = global_process_set,
                   with_received: bool | None = None) -> int:
    """with_received (default: whether splits were given): return (output,
    received_splits); autograd asks for them without splits, to send the gradient back."""
    if with_received is None:
        with_received = splits is not None
    check_tensor(tensor, "alltoall")
    split_list = None
    if splits is not None:
        split_list = [int(s) for s in (splits.tolist() if isinstance(splits, torch.Tensor)
                                       else splits)]
    direct = _direct([tensor], RequestType.ALLTOALL)
    source = _contiguous(tensor, direct)
    outputs: list[torch.Tensor] = []
    handle = core.alltoall_async(_view(source, direct), split_list,
                                 empty_allocator(source, outputs, direct),
                                 names_for(name, 1, "alltoall", process_set)[0],
                                 _device(tensor, direct), process_set,
                                 ready_event(tensor) if direct else None)

    def finish(results: list[Any], _kept: torch.Tensor = source) -> Any:
        received = torch.from_numpy(np.asarray(results[0][1]))
        output = _back(outputs[0], tensor, direct)
        return (output, received) if with_received else output
    return register([handle], finish)


# -- reducescatter -------------------------------------------------------------------------
def grouped_reducescatter_async(tensors: Sequence[torch.Tensor], name: str | None = None,
                                op: ReduceOp = Average,
                                process_set: ProcessSet = global_process_set,
                                prescale_factor: float = 1.0,
                                postscale_factor: float = 1.0, *, waited: bool = False) -> int:
    process_set = core.resolve(process_set)
    rank, size = process_set.rank(), process_set.size()
    op = ReduceOp(op)
    direct = _direct(tensors, RequestType.REDUCESCATTER, op)
    sources, outputs = [], []
    for tensor in tensors:
        check_tensor(tensor, "reducescatter")
        sources.append(_contiguous(tensor, direct))
        if direct:
            shape = core.reducescatter_shape(tensor.shape, rank, size) if tensor.dim() else ()
            outputs.append(torch.empty(shape, dtype=tensor.dtype, device=tensor.device))
    names = names_for(name, len(tensors), "reducescatter", process_set)
    device = _device(tensors[0], direct) if tensors else "cpu"
    if not direct:  # host memory: the results are views of runtime-owned blocks
        handles = core.grouped_reducescatter_async(
            [as_numpy(t) for t in sources], [None] * len(tensors), names, op,
            prescale_factor, postscale_factor, device, process_set, waited=waited)
        return register(handles, lambda results, _kept=sources: _owned_results(results,
                                                                               tensors))
    handles = core.grouped_reducescatter_async(
        [_view(t, direct) for t in sources], [_view(o, direct) for o in outputs], names, op,
        prescale_factor, postscale_factor, device, process_set, ready_event(tensors[0]))
    return register(handles, lambda _, _kept=sources: [_back(o, t, direct)
                                                       for o, t in zip(outputs, tensors)])


def reducescatter_async(tensor: torch.Tensor, name: str | None = None, op: ReduceOp = Average,
                        process_set: ProcessSet = global_process_set,
                        prescale_factor: float = 1.0, postscale_factor: float = 1.0, *,
                        waited: bool = False) -> int:
    handle = grouped_reducescatter_async([tensor], name, op, process_set, prescale_factor,
                                         postscale_factor, waited=waited)
    handles, finish = _handles[handle]
    _handles[handle] = (handles, lambda results: finish(results)[0])
    return handle


# -- synchronization -----------------------------------------------------------------------
def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Block until every rank (of the set) reaches the barrier."""
    core.barrier_async(process_set).wait()


def join(device: int = -1) -> int:
    """Signal that this rank has no more data; allreduces of the others continue with this
    rank contributing zeros. Returns the rank that joined last, once all have joined."""
    return int(core.join_async().wait())

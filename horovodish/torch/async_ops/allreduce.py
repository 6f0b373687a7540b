"""Allreduce on torch tensors: out of place, in place (``_``), grouped, and into the
runtime's result blocks; each returns an integer handle, except the blocking in-place
forms.

Per-call Python is most of a small allreduce's time, so a single plain tensor (a
contiguous CPU tensor of a numpy dtype outside autograd, or a contiguous CUDA tensor on
the NCCL path) goes straight to the core's single-tensor submit; every other call takes
the grouped path, which converts and stages what it must.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import torch

from ...common.api import collectives as core
from ...common.api.process_sets import ProcessSet, global_process_set
from ...common.execution.cuda import DEVICE_CUDA
from ...common.messages import Average, ReduceOp, RequestType
from ...common.messages import resolve_op as _resolve_op
from .. import tensor_views
from ..tensor_views import as_cuda_view, check_tensor, from_cuda_views, ready_event
from .handle_table import OWNED, OnDevice, register, synchronize
from .op_names import names_for
from .tensor_placement import (contiguous_for_core, core_device, core_view, owned_results,
                               plain_array, takes_direct_path, write_back)

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
        ready_event(tensor)), OnDevice(tensor, in_place))


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
            source = core_view(output, direct)
            targets.append(source)
        else:  # no output: the runtime owns the result (a view of its block)
            contiguous = contiguous_for_core(tensor, direct)
            if direct:  # device memory is read later, in stream order: keep it alive
                kept.append(contiguous)
            source = core_view(contiguous, direct)
            targets.append(None if output is None else core_view(output, direct))
        sources.append(source)
    names = names_for(name, len(tensors), "allreduce", process_set)
    device = core_device(tensors[0], direct) if tensors else "cpu"
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
    direct = takes_direct_path(tensors, RequestType.ALLREDUCE, op)
    outputs = [contiguous_for_core(t, direct) for t in tensors]
    return _grouped_allreduce_async(tensors, outputs, name, op,
                                    prescale_factor, postscale_factor, "grouped_allreduce_",
                                    write_back(tensors, outputs), process_set, in_place=True,
                                    direct=direct, waited=waited)


def _allreduce_plain(array: np.ndarray, target: np.ndarray | None, result: Any,
                     name: str | Sequence[str] | None, op: ReduceOp, prescale_factor: float,
                     postscale_factor: float, process_set: ProcessSet) -> int:
    """One tensor that plain_array could view, straight to the core's single-tensor
    submit (cheaper than the grouped path); the handle returns result (OWNED: the
    runtime's result, target None)."""
    return register(core.allreduce_async(
        array, target, names_for(name, 1, "allreduce", process_set)[0], op, prescale_factor,
        postscale_factor, "cpu", process_set), result)


def allreduce_async(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                    op: ReduceOp | None = None, prescale_factor: float = 1.0,
                    postscale_factor: float = 1.0,
                    process_set: ProcessSet = global_process_set) -> int:
    op = _resolve_op(average, op)
    array = plain_array(tensor)
    if array is not None:  # the result is the runtime's: no output to allocate or fill
        return _allreduce_plain(array, None, OWNED, name, op, prescale_factor,
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
    array = plain_array(tensor)
    if array is not None:
        return _allreduce_plain(array, array, tensor, name, op, prescale_factor,
                                postscale_factor, process_set)
    if type(tensor) is torch.Tensor and tensor.is_cuda:
        handle = _allreduce_on_device(tensor, True, name, op, prescale_factor,
                                      postscale_factor, process_set)
        if handle is not None:
            return handle
    direct = takes_direct_path([tensor], RequestType.ALLREDUCE, op)
    output = contiguous_for_core(tensor, direct)
    copy_back = write_back([tensor], [output])
    return _grouped_allreduce_async([tensor], [output], name, op, prescale_factor,
                                    postscale_factor, "allreduce_",
                                    lambda results: copy_back(results)[0], process_set,
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
    if takes_direct_path(tensors, RequestType.ALLREDUCE, op):  # views of a device block
        def finish_device(results: list[Any]) -> Any:
            out = from_cuda_views(results, [t.dtype for t in tensors])
            return out[0] if single else out
        return _grouped_allreduce_async(
            tensors, [None] * len(tensors), name, op, prescale_factor, postscale_factor,
            "allreduce" if single else "grouped_allreduce", finish_device, process_set,
            direct=True, waited=waited)

    def finish_host(results: list[Any]) -> Any:
        out = owned_results(results, tensors)
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
    array = plain_array(tensor)
    if array is not None:  # waited on at once: no handle to register
        _allreduce_now(array, array, name, op, prescale_factor, postscale_factor, process_set)
        return tensor
    return synchronize(allreduce_async_(tensor, None, name, op, prescale_factor,
                                        postscale_factor, process_set))


def allreduce_plain_now(tensor: torch.Tensor, name: str | None, op: ReduceOp,
                        prescale_factor: float, postscale_factor: float,
                        process_set: ProcessSet) -> torch.Tensor | None:
    """The blocking out-of-place allreduce of a tensor plain_array can view, as a view
    of the runtime's result block; None for any other tensor (then take the general
    path). Per-call Python is most of a small allreduce's time: this skips the handle."""
    array = plain_array(tensor)
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



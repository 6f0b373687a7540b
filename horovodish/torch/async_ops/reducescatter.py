"""Reducescatter on torch tensors: reduce across ranks, then keep this rank's slice of
the first dimension; grouped or single."""
from __future__ import annotations

from typing import Sequence

import torch

from ...common.api import collectives as core
from ...common.api.process_sets import ProcessSet, global_process_set
from ...common.messages import Average, ReduceOp, RequestType
from ..tensor_views import as_numpy, check_tensor, ready_event
from .handle_table import OWNED, register, then
from .op_names import names_for
from .tensor_placement import (contiguous_for_core, core_device, core_view, on_callers_device,
                               owned_results, plain_array, takes_direct_path)


def grouped_reducescatter_async(tensors: Sequence[torch.Tensor], name: str | None = None,
                                op: ReduceOp = Average,
                                process_set: ProcessSet = global_process_set,
                                prescale_factor: float = 1.0,
                                postscale_factor: float = 1.0, *, waited: bool = False) -> int:
    process_set = core.resolve(process_set)
    rank, size = process_set.rank(), process_set.size()
    op = ReduceOp(op)
    direct = takes_direct_path(tensors, RequestType.REDUCESCATTER, op)
    sources, outputs = [], []
    for tensor in tensors:
        check_tensor(tensor, "reducescatter")
        sources.append(contiguous_for_core(tensor, direct))
        if direct:
            shape = core.reducescatter_shape(tensor.shape, rank, size) if tensor.dim() else ()
            outputs.append(torch.empty(shape, dtype=tensor.dtype, device=tensor.device))
    names = names_for(name, len(tensors), "reducescatter", process_set)
    device = core_device(tensors[0], direct) if tensors else "cpu"
    if not direct:  # host memory: the results are views of runtime-owned blocks
        handles = core.grouped_reducescatter_async(
            [as_numpy(t) for t in sources], [None] * len(tensors), names, op,
            prescale_factor, postscale_factor, device, process_set, waited=waited)
        return register(handles, lambda results, _kept=sources: owned_results(results,
                                                                              tensors))
    handles = core.grouped_reducescatter_async(
        [core_view(t, direct) for t in sources], [core_view(o, direct) for o in outputs],
        names, op, prescale_factor, postscale_factor, device, process_set,
        ready_event(tensors[0]))
    return register(handles, lambda _, _kept=sources: [on_callers_device(o, t, direct)
                                                       for o, t in zip(outputs, tensors)])


def reducescatter_async(tensor: torch.Tensor, name: str | None = None, op: ReduceOp = Average,
                        process_set: ProcessSet = global_process_set,
                        prescale_factor: float = 1.0, postscale_factor: float = 1.0, *,
                        waited: bool = False) -> int:
    array = plain_array(tensor)
    if array is not None:  # the short path: the result is a view of a runtime block
        return register(core.grouped_reducescatter_async(
            [array], [None], names_for(name, 1, "reducescatter", process_set), op,
            prescale_factor, postscale_factor, "cpu", process_set, waited=waited)[0], OWNED)
    return then(grouped_reducescatter_async([tensor], name, op, process_set, prescale_factor,
                                            postscale_factor, waited=waited),
                lambda scattered: scattered[0])

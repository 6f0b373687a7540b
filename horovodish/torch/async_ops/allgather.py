"""Allgather on torch tensors: every rank's tensor concatenated along the first
dimension (sizes may differ), grouped or single, and into a given output."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ...common.api import collectives as core
from ...common.api.process_sets import ProcessSet, global_process_set
from ...common.messages import RequestType
from .. import tensor_views
from ..tensor_views import as_numpy, check_tensor, device_class, empty_allocator, ready_event
from .handle_table import OWNED, register, then
from .op_names import names_for
from .tensor_placement import (contiguous_for_core, core_device, core_view, on_callers_device,
                               owned_results, plain_array, takes_direct_path)


# waited (keyword, beyond Horovod): the caller synchronizes at once (the blocking forms),
# so the runtime's timer is not armed for the call (Runtime.submit_one).
def grouped_allgather_async(tensors: Sequence[torch.Tensor], name: str | None = None,
                            process_set: ProcessSet = global_process_set, *,
                            waited: bool = False) -> int:
    for tensor in tensors:
        check_tensor(tensor, "allgather")
    direct = takes_direct_path(tensors, RequestType.ALLGATHER)
    sources = [contiguous_for_core(t, direct) for t in tensors]
    names = names_for(name, len(tensors), "allgather", process_set)
    device = core_device(tensors[0], direct) if tensors else "cpu"
    if not direct:  # host memory: the results are views of runtime-owned blocks
        handles = core.grouped_allgather_async([as_numpy(t) for t in sources],
                                               [None] * len(tensors), names, device,
                                               process_set, waited=waited)
        return register(handles, lambda results, _kept=sources: owned_results(results,
                                                                              tensors))
    outputs: list[list[torch.Tensor]] = [[] for _ in tensors]
    handles = core.grouped_allgather_async(
        [core_view(t, direct) for t in sources],
        [empty_allocator(t, out, direct) for t, out in zip(sources, outputs)],
        names, device, process_set, ready_event(tensors[0]))
    return register(handles, lambda _, _kept=sources: [on_callers_device(out[0], t, direct)
                                                       for out, t in zip(outputs, tensors)])


def allgather_async(tensor: torch.Tensor, name: str | None = None,
                    process_set: ProcessSet = global_process_set, *,
                    waited: bool = False) -> int:
    array = plain_array(tensor)
    if array is not None:  # the short path: the result is a view of a runtime block
        return register(core.allgather_async(array, None,
                                             names_for(name, 1, "allgather", process_set)[0],
                                             "cpu", process_set, waited=waited), OWNED)
    return then(grouped_allgather_async([tensor], name, process_set, waited=waited),
                lambda gathered: gathered[0])


def allgather_into_async(tensor: torch.Tensor, output: torch.Tensor, name: str | None = None,
                         process_set: ProcessSet = global_process_set) -> int:
    """allgather into a given contiguous output of the gathered shape (beyond Horovod):
    the sharded optimizer gathers updated shards straight into the flat parameters.
    tensor may be this rank's part of output (then gathered in place); otherwise it
    must not overlap output. synchronize returns output."""
    check_tensor(tensor, "allgather")
    if tensor_views.staged(output):  # via host memory, then into output
        return then(grouped_allgather_async([tensor], name, process_set),
                    lambda gathered: output.copy_(gathered[0]))

    def allocate(shape: tuple[int, ...]) -> np.ndarray:
        if tuple(shape) != tuple(output.shape):
            raise ValueError(f"allgather into an output of shape {list(output.shape)}: the "
                             f"gathered tensor has shape {list(shape)}")
        return as_numpy(output)
    source = contiguous_for_core(tensor)
    handles = core.grouped_allgather_async(
        [as_numpy(source)], [allocate], names_for(name, 1, "allgather", process_set),
        device_class(tensor), process_set)
    return register(handles, lambda _: output)

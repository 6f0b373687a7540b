"""Alltoall on torch tensors: rows splits[i] of this rank's tensor go to rank i."""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ...common.api import collectives as core
from ...common.api.process_sets import ProcessSet, global_process_set
from ...common.messages import RequestType
from ..tensor_views import check_tensor, empty_allocator, ready_event
from .handle_table import register
from .op_names import names_for
from .tensor_placement import (contiguous_for_core, core_device, core_view, on_callers_device,
                               plain_array, takes_direct_path)


def _as_tensors(result: tuple[np.ndarray, np.ndarray], with_received: bool) -> Any:
    output, received = result
    output = torch.from_numpy(output)
    return (output, torch.from_numpy(np.asarray(received))) if with_received else output


def alltoall_async(tensor: torch.Tensor, splits: Any = None, name: str | None = None,
                   process_set: ProcessSet = global_process_set,
                   with_received: bool | None = None, *, waited: bool = False) -> int:
    """with_received (default: whether splits were given): return (output,
    received_splits); autograd asks for them without splits, to send the gradient back.
    waited: the caller synchronizes at once (the blocking form)."""
    if with_received is None:
        with_received = splits is not None
    check_tensor(tensor, "alltoall")
    split_list = None
    if splits is not None:
        split_list = [int(s) for s in (splits.tolist() if isinstance(splits, torch.Tensor)
                                       else splits)]
    array = plain_array(tensor)
    if array is not None:  # the short path: the output is a view of a runtime block
        handle = core.alltoall_async(array, split_list, None,
                                     names_for(name, 1, "alltoall", process_set)[0], "cpu",
                                     process_set, waited=waited)
        return register([handle], lambda results: _as_tensors(results[0], with_received))
    direct = takes_direct_path([tensor], RequestType.ALLTOALL)
    source = contiguous_for_core(tensor, direct)
    outputs: list[torch.Tensor] = []
    handle = core.alltoall_async(core_view(source, direct), split_list,
                                 empty_allocator(source, outputs, direct),
                                 names_for(name, 1, "alltoall", process_set)[0],
                                 core_device(tensor, direct), process_set,
                                 ready_event(tensor) if direct else None)

    def finish(results: list[Any], _kept: torch.Tensor = source) -> Any:
        received = torch.from_numpy(np.asarray(results[0][1]))
        output = on_callers_device(outputs[0], tensor, direct)
        return (output, received) if with_received else output
    return register([handle], finish)

"""Broadcast on torch tensors: root_rank's tensor on every rank, as a new tensor or in
place (``_``)."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from ...common.api import collectives as core
from ...common.api.process_sets import ProcessSet, global_process_set
from ...common.handles import Handle
from ...common.messages import RequestType
from ..tensor_views import check_tensor, ready_event
from .handle_table import OWNED, register, synchronize
from .op_names import names_for
from .tensor_placement import (contiguous_for_core, core_device, core_view, empty_result_like,
                               on_callers_device, owned_results, plain_array,
                               takes_direct_path, write_back)


def _broadcast_plain(array: np.ndarray, target: np.ndarray | None, root_rank: int,
                     name: str | None, process_set: ProcessSet, waited: bool) -> Handle:
    """The short path of a tensor plain_array could view: straight to the core (in
    place: target is array; None: the result is a view of a runtime-owned block)."""
    return core.broadcast_async(array, target, root_rank,
                                names_for(name, 1, "broadcast", process_set)[0], "cpu",
                                process_set, waited=waited)


def _broadcast_async(tensor: torch.Tensor, output: torch.Tensor | None, root_rank: int,
                     name: str | None, finish: Callable[[list[Any]], Any],
                     process_set: ProcessSet = global_process_set,
                     in_place: bool = False, direct: bool = False,
                     waited: bool = False) -> int:
    """in_place: output is tensor or its host stand-in (see allreduce.py's
    _grouped_allreduce_async). output None: the runtime's (host memory)."""
    check_tensor(tensor, "broadcast")
    kept = None
    if in_place:
        source = target = core_view(output, direct)
    else:
        kept = contiguous_for_core(tensor, direct)
        source = core_view(kept, direct)
        target = None if output is None else core_view(output, direct)
    handle = core.broadcast_async(source, target, root_rank,
                                  names_for(name, 1, "broadcast", process_set)[0],
                                  core_device(tensor, direct), process_set,
                                  ready_event(tensor) if direct else None, waited=waited)
    return register([handle], (lambda results, _kept=kept: finish(results)) if direct
                    else finish)


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                    process_set: ProcessSet = global_process_set, *,
                    waited: bool = False) -> int:
    array = plain_array(tensor)
    if array is not None:
        return register(_broadcast_plain(array, None, root_rank, name, process_set, waited),
                        OWNED)
    direct = takes_direct_path([tensor], RequestType.BROADCAST)
    if not direct:  # host memory: the result is a view of a runtime-owned block
        return _broadcast_async(tensor, None, root_rank, name,
                                lambda results: owned_results(results, [tensor])[0],
                                process_set, waited=waited)
    output = empty_result_like(tensor, direct)
    return _broadcast_async(tensor, output, root_rank, name,
                            lambda _: on_callers_device(output, tensor, direct), process_set,
                            direct=direct)


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                     process_set: ProcessSet = global_process_set, *,
                     waited: bool = False) -> int:
    array = plain_array(tensor)
    if array is not None:
        return register(_broadcast_plain(array, array, root_rank, name, process_set, waited),
                        tensor)
    direct = takes_direct_path([tensor], RequestType.BROADCAST)
    output = contiguous_for_core(tensor, direct)
    copy_back = write_back([tensor], [output])
    return _broadcast_async(tensor, output, root_rank, name,
                            lambda results: copy_back(results)[0], process_set,
                            in_place=True, direct=direct, waited=waited)


def broadcast_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    array = plain_array(tensor)
    if array is not None:  # waited on at once: no handle to register
        _broadcast_plain(array, array, root_rank, name, process_set, True).wait()
        return tensor
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set, waited=True))

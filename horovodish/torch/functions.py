"""Broadcasting model and optimizer state, and object collectives (Horovod's names).

Tensors are broadcast packed: one flat buffer per dtype, so a model with hundreds of
parameters costs a handful of collectives instead of hundreds.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable, Iterable, Sequence

import torch

from ..common import api
from ..common.api import objects
from ..common.errors import HorovodInternalError
from ..common.api.process_sets import ProcessSet, global_process_set
from . import mpi_ops
from .sparse import sparse_zeros


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    return objects.broadcast_object(obj, root_rank, name, process_set)


def allgather_object(obj: Any, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> list[Any]:
    return objects.allgather_object(obj, name, process_set)


def broadcast_tensors_(tensors: Sequence[torch.Tensor], root_rank: int, name: str,
                       process_set: ProcessSet = global_process_set) -> None:
    """Overwrite every tensor with root_rank's, one packed broadcast per dtype.

    Every rank must pass tensors of the same dtypes and sizes in the same order.
    """
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = defaultdict(list)
    for tensor in tensors:
        by_dtype[tensor.dtype].append(tensor)
    is_root = api.rank() == root_rank
    with torch.no_grad():
        for dtype in sorted(by_dtype, key=str):
            group = by_dtype[dtype]
            # On their device when they share one (a CUDA model's parameters: the NCCL
            # path, where chosen), else on the host: a group may mix devices (Adam keeps
            # its step count on the CPU next to CUDA moments).
            devices = {t.device for t in group}
            device = devices.pop() if len(devices) == 1 else torch.device("cpu")
            flat = torch.cat([t.detach().reshape(-1).to(device) for t in group])
            tag = f"{name}.{str(dtype).replace('torch.', '')}"
            try:
                mpi_ops.broadcast_(flat, root_rank, name=tag, process_set=process_set)
            except HorovodInternalError as exc:
                raise HorovodInternalError(
                    f"{exc} (broadcast '{name}' packs {len(group)} {dtype} tensors into one "
                    "buffer: the ranks passed different tensors. Every rank must pass the "
                    "same model / optimizer.)") from exc
            if is_root:
                continue
            offset = 0
            for tensor in group:
                count = tensor.numel()
                tensor.copy_(flat[offset:offset + count].view(tensor.shape))
                offset += count


def broadcast_parameters(params: Any, root_rank: int,
                         process_set: ProcessSet = global_process_set) -> None:
    """Make every rank's parameters root_rank's, in place.

    ``params``: a ``state_dict()``, ``named_parameters()`` (iterator or list of
    (name, tensor)) or a list of tensors.
    """
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, torch.Tensor):
        raise ValueError("broadcast_parameters expects a state_dict, named_parameters() or "
                         "a list of tensors, not a single tensor; use hvd.broadcast_().")
    elif isinstance(params, Iterable):
        items = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise ValueError(f"invalid params of type {type(params).__name__}")
    for key, value in items:
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"broadcast_parameters: entry {key!r} is a "
                             f"{type(value).__name__}, not a tensor")
    broadcast_tensors_([value for _, value in items], root_rank, "broadcast_parameters",
                       process_set)


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int,
                              model: torch.nn.Module | None = None,
                              process_set: ProcessSet = global_process_set) -> None:
    """Make every rank's optimizer state and hyper-parameters root_rank's.

    Root sends the state's structure (keys, tensor shapes and dtypes, non-tensor values
    and each param group's hyper-parameters) as an object, then the tensors packed. So,
    unlike Horovod, no zero-gradient step is needed to create missing state: a rank with
    empty state receives root's, and if root's is empty every rank's becomes empty. Works
    on a DistributedOptimizer too (it shares its wrapped optimizer's state).

    What Horovod's step leaves behind is kept, since scripts read it: on a rank whose
    optimizer had no state, each parameter that requires grad and has no gradient gets a
    zero one (an empty sparse one for SparseAdam and for the sparse embeddings of
    ``model``, Horovod's argument for telling them apart).
    """
    sync = getattr(optimizer, "_horovodish", None)  # a DistributedOptimizer's
    if sync is not None and sync.broadcast_state(root_rank):  # sharded state: zero.py
        return
    state_dict = optimizer.state_dict()
    if not state_dict["state"]:
        _zero_missing_grads(optimizer, model)
    is_root = api.rank() == root_rank
    shapes = _param_shapes(optimizer)
    layout = _layout(state_dict, shapes) if is_root else None
    layout = objects.broadcast_object(layout, root_rank, "broadcast_optimizer_state.layout",
                                      process_set)
    # Every rank learns of any rank's difference, so all raise (root's state would
    # otherwise land on parameters of other shapes, and fail later on one rank alone).
    difference = _difference(layout["param_shapes"], shapes, root_rank)
    differences = [d for d in objects.allgather_object(
        difference, "broadcast_optimizer_state.check", process_set) if d]
    if differences:
        raise ValueError(f"broadcast_optimizer_state: {differences[0]}; every rank must "
                         "build the same optimizer over the same parameters.")
    local_groups = state_dict["param_groups"]
    state: dict[Any, dict[str, Any]] = {}
    tensors: list[torch.Tensor] = []
    for key, entries in layout["state"].items():
        local = state_dict["state"].get(key, {})
        state[key] = {}
        for field, (is_tensor, spec) in entries.items():
            if not is_tensor:
                state[key][field] = spec
                continue
            shape, dtype = spec
            tensor = local.get(field)
            if not (isinstance(tensor, torch.Tensor) and tensor.shape == shape
                    and tensor.dtype == dtype):
                tensor = torch.empty(shape, dtype=dtype)
            state[key][field] = tensor
            tensors.append(tensor)
    broadcast_tensors_(tensors, root_rank, "broadcast_optimizer_state", process_set)
    groups = [dict(root_group, params=local_group["params"])
              for root_group, local_group in zip(layout["param_groups"], local_groups)]
    load_state_in_place(optimizer, {"state": state, "param_groups": groups})
    # Collective, so every rank restarts alike: a worker that joins an elastic job (or
    # rebuilds its optimizer) starts its DistributedOptimizer's first-step agreement,
    # which the others would otherwise never make again.
    if sync is not None:
        sync.restart_agreement()


def _zero_missing_grads(optimizer: torch.optim.Optimizer,
                        model: torch.nn.Module | None) -> None:
    """Zero gradients where there are none, as Horovod's state-creating step leaves them
    (it also overwrote existing gradients with zeros; those are kept here)."""
    sparse = {id(p) for module in (model.modules() if model is not None else ())
              if isinstance(module, torch.nn.Embedding) and module.sparse
              for p in module.parameters()}
    all_sparse = isinstance(optimizer, torch.optim.SparseAdam)
    for group in optimizer.param_groups:
        for param in group["params"]:
            if param.requires_grad and param.grad is None:
                param.grad = sparse_zeros(param, 1) if all_sparse or id(param) in sparse \
                    else torch.zeros_like(param)


def load_state_in_place(optimizer: torch.optim.Optimizer, state_dict: dict[str, Any],
                        load: Callable[[dict[str, Any]], None] | None = None) -> None:
    """``optimizer.load_state_dict(state_dict)`` (or ``load``), keeping the identity of
    ``optimizer.state``, ``optimizer.param_groups`` and each group dict. torch's replaces
    them all, which detached an LR scheduler built on the optimizer a DistributedOptimizer
    wraps (the two share these objects): the scheduler went on setting the lr of groups
    the wrapper no longer used. References a user keeps to a group stay live too."""
    groups, kept_groups, state = optimizer.param_groups, list(optimizer.param_groups), \
        optimizer.state
    (load or optimizer.load_state_dict)(state_dict)
    for kept, loaded in zip(kept_groups, optimizer.param_groups):
        if kept is not loaded:
            kept.clear()
            kept.update(loaded)
    groups[:] = kept_groups
    optimizer.param_groups = groups
    if optimizer.state is not state:
        loaded_state = optimizer.state
        state.clear()
        state.update(loaded_state)
        optimizer.state = state


def _param_shapes(optimizer: torch.optim.Optimizer) -> list[list[tuple[int, ...]]]:
    return [[tuple(p.shape) for p in group["params"]] for group in optimizer.param_groups]


def _difference(root: list[list[tuple[int, ...]]], mine: list[list[tuple[int, ...]]],
                root_rank: int) -> str | None:
    """How this rank's parameters differ from root's (group count, sizes, shapes)."""
    me = api.rank()
    if len(root) != len(mine):
        return f"rank {root_rank} has {len(root)} param groups, rank {me} {len(mine)}"
    for index, (theirs, ours) in enumerate(zip(root, mine)):
        if len(theirs) != len(ours):
            return (f"param group {index} has {len(theirs)} parameters on rank {root_rank}, "
                    f"{len(ours)} on rank {me}")
        for position, (a, b) in enumerate(zip(theirs, ours)):
            if a != b:
                return (f"parameter {position} of param group {index} has shape {list(a)} "
                        f"on rank {root_rank}, {list(b)} on rank {me}")
    return None


def _layout(state_dict: dict[str, Any],
            param_shapes: list[list[tuple[int, ...]]]) -> dict[str, Any]:
    """What a receiving rank needs to rebuild root's state: tensors as (shape, dtype),
    and the parameters' shapes to check its own against."""
    state = {key: {field: (True, (value.shape, value.dtype)) if isinstance(value, torch.Tensor)
                   else (False, value) for field, value in entries.items()}
             for key, entries in state_dict["state"].items()}
    groups = [{k: v for k, v in group.items() if k != "params"}
              for group in state_dict["param_groups"]]
    return {"state": state, "param_groups": groups, "param_shapes": param_shapes}

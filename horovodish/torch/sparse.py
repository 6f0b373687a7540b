"""Sparse allreduce: gather every rank's (index, value) pairs instead of densifying.

The result is the concatenation of all ranks' entries as one uncoalesced sparse tensor
(duplicate indices add up when it is used or coalesced); Average divides the values by
the set size. Embedding gradients are the usual customer.

The handle is callable, as Horovod's (its ``sparse_allreduce_async`` returns a function
and its DistributedOptimizer calls it): ``handle()`` waits and returns the result. It is
also an integer handle, so ``synchronize(handle)`` and ``poll(handle)`` work on it too
(Horovod's ``synchronize`` returns None for it and its ``poll`` fails).
"""
from __future__ import annotations

from typing import Any

import torch

from ..common.api import collectives as core
from ..common.messages import ReduceOp
from ..common.api.process_sets import ProcessSet, global_process_set
from . import async_ops
from .async_ops import Average, allgather_async


class SparseHandle(int):
    """An integer handle that is also Horovod's callable: ``handle()`` is
    ``synchronize(handle)``."""

    def __call__(self) -> torch.Tensor:
        return async_ops.synchronize(self)


def sparse_allreduce_async(tensor: torch.Tensor, name: str | None = None,
                           op: ReduceOp = Average,
                           process_set: ProcessSet = global_process_set) -> SparseHandle:
    """Start a sparse allreduce; ``handle()`` (or ``synchronize(handle)``) returns the
    reduced sparse tensor."""
    if not tensor.is_sparse:
        raise TypeError(f"sparse_allreduce_async expects a sparse COO tensor, got layout "
                        f"{tensor.layout}; use allreduce_async for dense tensors")
    if ReduceOp(op) not in (ReduceOp.SUM, ReduceOp.AVERAGE):
        raise ValueError(f"sparse allreduce of '{name}': only Sum and Average are defined for "
                         f"sparse tensors, not {ReduceOp(op).name.capitalize()}")
    process_set = core.resolve(process_set)
    name = name or core.auto_name("sparse_allreduce", process_set)
    sparse = tensor.coalesce() if not tensor.is_coalesced() else tensor
    # Allgather concatenates along dim 0, so indices travel as (nnz, ndim).
    values_handle = allgather_async(sparse._values().contiguous(), f"{name}.values", process_set)
    indices_handle = allgather_async(sparse._indices().t().contiguous(), f"{name}.indices",
                                     process_set)
    values_core, values_finish = async_ops.take(values_handle)
    indices_core, indices_finish = async_ops.take(indices_handle)
    size = process_set.size()

    def finish(results: list[Any]) -> torch.Tensor:
        values = values_finish(results[:len(values_core)])
        indices = indices_finish(results[len(values_core):])
        if ReduceOp(op) == ReduceOp.AVERAGE:
            values = values / size
        return torch.sparse_coo_tensor(indices.t(), values, tensor.shape, check_invariants=False)

    return SparseHandle(async_ops.register(values_core + indices_core, finish))


def sparse_zeros(param: torch.Tensor, sparse_dim: int) -> torch.Tensor:
    """An empty sparse gradient for param: what a rank without a gradient contributes to
    the others' sparse reduction, and what an optimizer for sparse gradients can take."""
    indices = torch.empty((sparse_dim, 0), dtype=torch.int64, device=param.device)
    values = torch.empty((0, *param.shape[sparse_dim:]), dtype=param.dtype, device=param.device)
    return torch.sparse_coo_tensor(indices, values, param.shape, check_invariants=False)


def sparse_allreduce(tensor: torch.Tensor, name: str | None = None, op: ReduceOp = Average,
                     process_set: ProcessSet = global_process_set) -> torch.Tensor:
    return async_ops.synchronize(sparse_allreduce_async(tensor, name, op, process_set))

"""Horovod's ``horovod.torch.mpi_ops``: every collective, same names, arguments, semantics.

The asynchronous, in-place and grouped forms come from async_ops; the blocking forms
here add compression and are differentiable (autograd.py) when an input requires grad.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from ..compat.horovod_paths.common_basics import _basics  # noqa: F401  (Horovod's hvd.mpi_ops._basics)
from ..common import messages as _reduce_ops
from ..compat.horovod_paths.common_util import (gpu_available, get_average_backwards_compatibility_fun,  # noqa: F401
                           num_rank_is_power_2)  # (Horovod's module has them)
from ..common.api.process_sets import ProcessSet, global_process_set
from ..common.compression import Compressor
from ..common.messages import Adasum, Average, Max, Min, Product, ReduceOp, Sum  # noqa: F401
from ..common.messages import resolve_op as _resolve_op
from . import autograd
from .async_ops import (allgather_async, allreduce_, allreduce_async,  # noqa: F401
                        allreduce_async_, allreduce_plain_now, alltoall_async, barrier,
                        broadcast_, broadcast_async, broadcast_async_,
                        grouped_allgather_async, grouped_allreduce_,
                        grouped_allreduce_async, grouped_allreduce_async_,
                        grouped_allreduce_into_runtime_async, grouped_reducescatter_async, join,
                        poll, reducescatter_async, synchronize)
from .compression import Compression


def allreduce(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
              compression: Compressor | None = Compression.none, op: ReduceOp | None = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Reduce tensor across ranks; returns a new tensor (the input is untouched)."""
    op = _resolve_op(average, op)
    if compression is Compression.none or compression is None:
        reduced = allreduce_plain_now(tensor, name, op, prescale_factor, postscale_factor,
                                      process_set)
        if reduced is not None:  # a plain CPU tensor outside autograd: the short path
            return reduced
    compression = compression or Compression.none
    compressed, ctx = compression.compress(tensor)
    reduced = autograd.allreduce(compressed, name, op, prescale_factor, postscale_factor,
                                 process_set)
    return compression.decompress(reduced, ctx)


def grouped_allreduce(tensors: Sequence[torch.Tensor], average: bool | None = None,
                      name: str | None = None, compression: Compressor | None = Compression.none,
                      op: ReduceOp | None = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    compression = compression or Compression.none
    packed = [compression.compress(t) for t in tensors]
    reduced = autograd.grouped_allreduce([p[0] for p in packed], name,
                                         _resolve_op(average, op), prescale_factor,
                                         postscale_factor, process_set)
    return [compression.decompress(r, p[1]) for r, p in zip(reduced, packed)]


def allgather(tensor: torch.Tensor, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Concatenate every rank's tensor along the first dimension (sizes may differ)."""
    return autograd.allgather(tensor, name, process_set)


def grouped_allgather(tensors: Sequence[torch.Tensor], name: str | None = None,
                      process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    return autograd.grouped_allgather(tensors, name, process_set)


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """root_rank's tensor on every rank, as a new tensor."""
    return autograd.broadcast(tensor, root_rank, name, process_set)


def alltoall(tensor: torch.Tensor, splits: Any = None, name: str | None = None,
             process_set: ProcessSet = global_process_set) -> Any:
    """Send splits[i] rows to rank i. With splits, returns (output, received_splits)."""
    return autograd.alltoall(tensor, splits, name, process_set)


def reducescatter(tensor: torch.Tensor, name: str | None = None, op: ReduceOp = Average,
                  process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> torch.Tensor:
    """Reduce across ranks, then keep this rank's slice of the first dimension."""
    return autograd.reducescatter(tensor, name, op, prescale_factor, postscale_factor,
                                  process_set)


def grouped_reducescatter(tensors: Sequence[torch.Tensor], name: str | None = None,
                          op: ReduceOp = Average, process_set: ProcessSet = global_process_set,
                          prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> list[torch.Tensor]:
    return autograd.grouped_reducescatter(tensors, name, op, prescale_factor,
                                          postscale_factor, process_set)


# Horovod's module-level helpers: average= or op= to the op a call means.
handle_average_backwards_compatibility = get_average_backwards_compatibility_fun(_reduce_ops)

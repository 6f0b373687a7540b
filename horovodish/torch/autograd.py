"""The blocking collectives, differentiable (Horovod's gradients), on top of async_ops.

Each function here runs the plain asynchronous collective and waits, unless autograd
would record the op (an input requires grad), in which case it runs it as a
``torch.autograd.Function``. A backward calls these same functions, so gradients of
gradients work too. ``mpi_ops``' blocking forms add compression on top. Each backward is
itself a collective, so every rank must run it: the name of a backward op is the
forward's name plus ``.grad``, and an unnamed forward gets its automatic name *before*
it runs, so backward names agree across ranks whenever forward names do.

Gradients (as in Horovod):
  allreduce      allreduce of the grad with the same op and scale factors
  allgather      the grad averaged over ranks, narrowed to this rank's rows
                 (grouped_allgather and grouped_reducescatter: the same per tensor, as
                 one grouped collective)
  broadcast      the grad averaged over ranks on the root, zeros elsewhere
  alltoall       alltoall of the grad back along the received splits
  reducescatter  allgather of the grad, times the scale factors, and times size for Sum
                 (Horovod's definition: for Average that is the exact gradient times
                 size, for Sum size times it, as if each rank's output were averaged)
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from ..common import api
from ..common.api import collectives as core
from ..common.messages import ReduceOp
from ..common.api.process_sets import ProcessSet
from . import async_ops


def _wants_grad(*tensors: torch.Tensor) -> bool:
    """Autograd would record an op on these inputs: take the differentiable path."""
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad
                                           for t in tensors)


def _name(name: str | None, opname: str, process_set: ProcessSet) -> str:
    """The op's name, made once (Horovod's "<op>.<name>" or an auto name): the backward
    derives its own from it."""
    return _Final(async_ops.names_for(name, 1, opname, process_set)[0])


def _names(name: Any, count: int, opname: str, process_set: ProcessSet) -> list[str]:
    return [_Final(n) for n in async_ops.names_for(name, count, opname, process_set)]


_Final = async_ops.FinalName


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str, op: ReduceOp, prescale: float,
                postscale: float, process_set: ProcessSet) -> torch.Tensor:
        ctx.args = (name, op, prescale, postscale, process_set)
        return async_ops.synchronize(async_ops.allreduce_async(
            tensor, name=name, op=op, prescale_factor=prescale, postscale_factor=postscale,
            process_set=process_set))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        name, op, prescale, postscale, process_set = ctx.args
        return (allreduce(grad, _Final(f"{name}.grad"), op, prescale, postscale, process_set),
                None, None, None, None, None)


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, names: list[str], op: ReduceOp, prescale: float, postscale: float,
                process_set: ProcessSet, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.args = (names, op, prescale, postscale, process_set)
        return tuple(async_ops.synchronize(async_ops.grouped_allreduce_async(
            tensors, name=names, op=op, prescale_factor=prescale, postscale_factor=postscale,
            process_set=process_set)))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple:
        names, op, prescale, postscale, process_set = ctx.args
        reduced = grouped_allreduce(list(grads), [_Final(f"{n}.grad") for n in names], op, prescale,
                                    postscale, process_set)
        return (None, None, None, None, None, *reduced)


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str,
                process_set: ProcessSet) -> torch.Tensor:
        ctx.args = (name, tensor.shape[0], process_set)
        return async_ops.synchronize(async_ops.allgather_async(tensor, name, process_set))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        name, rows, process_set = ctx.args
        reduced = allreduce(grad, _Final(f"{name}.grad"), ReduceOp.AVERAGE, 1.0, 1.0, process_set)
        # Every rank's row count, to find where this rank's rows start.
        counts = allgather(torch.tensor([rows], dtype=torch.int64), _Final(f"{name}.grad.rows"),
                           process_set)
        offset = int(counts[:process_set.rank()].sum())
        return reduced.narrow(0, offset, rows), None, None


class _GroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, names: list[str], process_set: ProcessSet,
                *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.args = (names, [t.shape[0] for t in tensors], process_set)
        return tuple(async_ops.synchronize(async_ops.grouped_allgather_async(
            tensors, names, process_set)))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple:
        names, rows, process_set = ctx.args
        reduced = grouped_allreduce(list(grads), [_Final(f"{n}.grad") for n in names],
                                    ReduceOp.AVERAGE, 1.0, 1.0, process_set)
        counts = allgather(torch.tensor([rows], dtype=torch.int64), _Final(f"{names[0]}.grad.rows"),
                           process_set)
        offsets = counts[:process_set.rank()].sum(dim=0).tolist()
        return (None, None, *(grad.narrow(0, offset, count)
                              for grad, offset, count in zip(reduced, offsets, rows)))


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, root_rank: int, name: str,
                process_set: ProcessSet) -> torch.Tensor:
        ctx.args = (root_rank, name, process_set)
        return async_ops.synchronize(async_ops.broadcast_async(tensor, root_rank, name,
                                                           process_set))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        root_rank, name, process_set = ctx.args
        reduced = allreduce(grad, _Final(f"{name}.grad"), ReduceOp.AVERAGE, 1.0, 1.0, process_set)
        if api.rank() != root_rank:
            reduced = torch.zeros_like(reduced)
        return reduced, None, None, None


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, splits: list[int] | None, name: str,
                process_set: ProcessSet) -> tuple[torch.Tensor, torch.Tensor]:
        output, received = async_ops.synchronize(async_ops.alltoall_async(
            tensor, splits, name, process_set, with_received=True))
        ctx.args = (received.tolist(), name, process_set)
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, _: Any) -> tuple:
        received, name, process_set = ctx.args
        output, _ = alltoall(grad, received, _Final(f"{name}.grad"), process_set)
        return output, None, None, None


def _reducescatter_grad_scale(op: ReduceOp, prescale: float, postscale: float,
                              process_set: ProcessSet) -> float:
    """What Horovod multiplies the gathered gradient of a reducescatter by: the scale
    factors, and the set's size for Sum (not 1/size for Average: its gradient is the
    gathered upstream gradient as it is)."""
    scale = prescale * postscale
    return scale * core.resolve(process_set).size() if op == ReduceOp.SUM else scale


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str, op: ReduceOp, prescale: float,
                postscale: float, process_set: ProcessSet) -> torch.Tensor:
        ctx.args = (name, _reducescatter_grad_scale(op, prescale, postscale, process_set),
                    process_set)
        return async_ops.synchronize(async_ops.reducescatter_async(
            tensor, name, op, process_set, prescale, postscale))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        name, scale, process_set = ctx.args
        gathered = allgather(grad, _Final(f"{name}.grad"), process_set)
        if scale != 1.0:
            gathered = gathered * scale
        return gathered, None, None, None, None, None


class _GroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, names: list[str], op: ReduceOp, prescale: float, postscale: float,
                process_set: ProcessSet, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.args = (names, _reducescatter_grad_scale(op, prescale, postscale, process_set),
                    process_set)
        return tuple(async_ops.synchronize(async_ops.grouped_reducescatter_async(
            tensors, names, op, process_set, prescale, postscale)))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple:
        names, scale, process_set = ctx.args
        gathered = grouped_allgather(list(grads), [_Final(f"{n}.grad") for n in names], process_set)
        if scale != 1.0:
            gathered = [g * scale for g in gathered]
        return (None, None, None, None, None, *gathered)


def allreduce(tensor: torch.Tensor, name: str | None, op: ReduceOp, prescale: float,
              postscale: float, process_set: ProcessSet) -> torch.Tensor:
    if not _wants_grad(tensor):
        return async_ops.synchronize(async_ops.allreduce_async(
            tensor, None, name, op, prescale, postscale, process_set))
    name = _name(name, "allreduce", process_set)
    return _Allreduce.apply(tensor, name, op, prescale, postscale, process_set)


def grouped_allreduce(tensors: Sequence[torch.Tensor], name: Any, op: ReduceOp,
                      prescale: float, postscale: float,
                      process_set: ProcessSet) -> list[torch.Tensor]:
    if not _wants_grad(*tensors):
        return async_ops.synchronize(async_ops.grouped_allreduce_async(
            tensors, None, name, op, prescale, postscale, process_set, waited=True))
    names = _names(name, len(tensors), "allreduce", process_set)
    return list(_GroupedAllreduce.apply(names, op, prescale, postscale, process_set, *tensors))


def allgather(tensor: torch.Tensor, name: str | None,
              process_set: ProcessSet) -> torch.Tensor:
    if not _wants_grad(tensor):
        return async_ops.synchronize(async_ops.allgather_async(tensor, name, process_set,
                                                               waited=True))
    return _Allgather.apply(tensor, _name(name, "allgather", process_set), process_set)


def grouped_allgather(tensors: Sequence[torch.Tensor], name: Any,
                      process_set: ProcessSet) -> list[torch.Tensor]:
    if not _wants_grad(*tensors):
        return async_ops.synchronize(async_ops.grouped_allgather_async(
            tensors, name, process_set, waited=True))
    names = _names(name, len(tensors), "allgather", process_set)
    return list(_GroupedAllgather.apply(names, process_set, *tensors))


def grouped_reducescatter(tensors: Sequence[torch.Tensor], name: Any, op: ReduceOp,
                          prescale: float, postscale: float,
                          process_set: ProcessSet) -> list[torch.Tensor]:
    if not _wants_grad(*tensors):
        return async_ops.synchronize(async_ops.grouped_reducescatter_async(
            tensors, name, op, process_set, prescale, postscale, waited=True))
    names = _names(name, len(tensors), "reducescatter", process_set)
    return list(_GroupedReducescatter.apply(names, ReduceOp(op), prescale, postscale,
                                            process_set, *tensors))


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None,
              process_set: ProcessSet) -> torch.Tensor:
    if not _wants_grad(tensor):
        return async_ops.synchronize(async_ops.broadcast_async(tensor, root_rank, name,
                                                               process_set, waited=True))
    return _Broadcast.apply(tensor, root_rank, _name(name, "broadcast", process_set),
                            process_set)


def alltoall(tensor: torch.Tensor, splits: Any, name: str | None,
             process_set: ProcessSet) -> Any:
    if not _wants_grad(tensor):
        return async_ops.synchronize(async_ops.alltoall_async(tensor, splits, name,
                                                              process_set, waited=True))
    split_list = None
    if splits is not None:
        split_list = [int(s) for s in (splits.tolist() if isinstance(splits, torch.Tensor)
                                       else splits)]
    output, received = _Alltoall.apply(tensor, split_list,
                                       _name(name, "alltoall", process_set), process_set)
    return output if splits is None else (output, received)


def reducescatter(tensor: torch.Tensor, name: str | None, op: ReduceOp, prescale: float,
                  postscale: float, process_set: ProcessSet) -> torch.Tensor:
    if not _wants_grad(tensor):
        return async_ops.synchronize(async_ops.reducescatter_async(
            tensor, name, op, process_set, prescale, postscale, waited=True))
    return _Reducescatter.apply(tensor, _name(name, "reducescatter", process_set),
                                ReduceOp(op), prescale, postscale, process_set)

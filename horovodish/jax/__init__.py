"""horovodish for JAX: Horovod's model (write the one-process loop, wrap the optimizer,
launch with ``horovodishrun``) on ``jax.Array``s and pytrees, through the same runtime
as torch and TensorFlow.

    import horovodish.jax as hvd
    hvd.init()
    params = hvd.broadcast_parameters(params, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optax.adam(1e-3))
    state = optimizer.init(params)
    grads = jax.jit(jax.grad(loss))(params, batch)       # this rank's shard
    updates, state = optimizer.update(grads, state, params)   # averaged over ranks
    params = optax.apply_updates(params, updates)

Host arrays reach the core as numpy views without a copy (``np.asarray`` of a CPU
array); results are written to fresh aligned host memory that JAX adopts without a copy.
Arrays on a CUDA device take the NCCL path as views of their device memory, and their
results come back on that device through DLPack (views.py). A pytree travels as one flat buffer per dtype:
one negotiated entry per dtype, whatever the leaf count. Collectives run outside
``jax.jit``: inside a traced function they raise ``ValueError`` (a collective there
would run once at trace time, or block XLA's executor; see docs/jax.md).
"""
from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ..common.api import *  # noqa: F401,F403 (init, rank, size, ... as every adapter)
from ..common.api import __all__ as _core_names
from ..common.api import collectives as core
from ..common.api.objects import allgather_object, broadcast_object
from ..common.api.process_sets import ProcessSet, global_process_set
from ..common.messages import ReduceOp, RequestType
from .handles import Handle
from . import elastic
from .optimizer import Compression, DistributedOptimizer
from .trees import allreduce_tree, broadcast_parameters
from .views import view

Average, Sum, Adasum = ReduceOp.AVERAGE, ReduceOp.SUM, ReduceOp.ADASUM
Min, Max, Product = ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT


def _name(name: str | None, opname: str, process_set: ProcessSet) -> str:
    return name if name is not None else core.auto_name(opname, process_set)


def allreduce_async(tensor: Any, op: ReduceOp = Average, name: str | None = None,
                    prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    process_set: ProcessSet = global_process_set) -> Handle:
    """A pytree of arrays is reduced as one operation per dtype (see trees.py)."""
    if not isinstance(tensor, (jax.Array, np.ndarray, np.generic)):
        return allreduce_tree(tensor, ReduceOp(op), name, prescale_factor, postscale_factor,
                              process_set)
    v = view(tensor, "allreduce", RequestType.ALLREDUCE, ReduceOp(op))
    handle = core.allreduce_async(v.array, v.empty(v.array.shape),
                                  _name(name, "allreduce", process_set), ReduceOp(op),
                                  float(prescale_factor), float(postscale_factor), v.device,
                                  process_set)
    return Handle([handle], lambda results: v.result(results[0]))


def allreduce(tensor: Any, op: ReduceOp = Average, name: str | None = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: ProcessSet = global_process_set) -> Any:
    """Reduce an array, or a whole pytree, across ranks (Average unless op says)."""
    return allreduce_async(tensor, op, name, prescale_factor, postscale_factor,
                           process_set).wait()


def grouped_allreduce(tensors: Sequence[Any], op: ReduceOp = Average,
                      name: str | None = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set) -> list[Any]:
    return list(allreduce(list(tensors), op, name, prescale_factor, postscale_factor,
                          process_set))


def allgather_async(tensor: Any, name: str | None = None,
                    process_set: ProcessSet = global_process_set) -> Handle:
    """Concatenate every rank's array along the first dimension (which may differ)."""
    v = view(tensor, "allgather", RequestType.ALLGATHER)
    handle = core.allgather_async(v.array, v.empty, _name(name, "allgather", process_set),
                                  v.device, process_set)
    return Handle([handle], lambda results: v.result(results[0]))


def allgather(tensor: Any, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> Any:
    return allgather_async(tensor, name, process_set).wait()


def broadcast_async(tensor: Any, root_rank: int, name: str | None = None,
                    process_set: ProcessSet = global_process_set) -> Handle:
    v = view(tensor, "broadcast", RequestType.BROADCAST)
    handle = core.broadcast_async(v.array, v.empty(v.array.shape), root_rank,
                                  _name(name, "broadcast", process_set), v.device, process_set)
    return Handle([handle], lambda results: v.result(results[0]))


def broadcast(tensor: Any, root_rank: int, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> Any:
    return broadcast_async(tensor, root_rank, name, process_set).wait()


def alltoall(tensor: Any, splits: Sequence[int] | None = None, name: str | None = None,
             process_set: ProcessSet = global_process_set) -> Any:
    """Send the i-th part of the first dimension to rank i; with ``splits``, returns
    (output, received splits), as Horovod does."""
    v = view(tensor, "alltoall", RequestType.ALLTOALL)
    handle = core.alltoall_async(v.array, None if splits is None else [int(s) for s in splits],
                                 v.empty, _name(name, "alltoall", process_set), v.device,
                                 process_set)
    output, received = Handle([handle], lambda results: results[0]).wait()
    if splits is None:
        return v.result(output)
    return v.result(output), jnp.asarray(np.asarray(received, np.int32))


def reducescatter(tensor: Any, op: ReduceOp = Average, name: str | None = None,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                  process_set: ProcessSet = global_process_set) -> Any:
    """Reduce across ranks and keep this rank's part of the first dimension (low ranks
    get the extra rows)."""
    v = view(tensor, "reducescatter", RequestType.REDUCESCATTER, ReduceOp(op))
    shape = core.reducescatter_shape(v.array.shape, process_set.rank(), process_set.size())
    handle = core.grouped_reducescatter_async(
        [v.array], [v.empty(shape)], [_name(name, "reducescatter", process_set)],
        ReduceOp(op), float(prescale_factor), float(postscale_factor), v.device,
        process_set)[0]
    return Handle([handle], lambda results: v.result(results[0])).wait()


def barrier(process_set: ProcessSet = global_process_set) -> None:
    core.barrier_async(process_set).wait()


def join() -> int:
    """This rank has no more data: it takes part with zeros until every rank joined;
    returns the last rank to join."""
    return int(core.join_async().wait())


def synchronize(handle: Handle) -> Any:
    return handle.wait()


def poll(handle: Handle) -> bool:
    return handle.done()


__all__ = [*_core_names, "Average", "Sum", "Adasum", "Min", "Max", "Product", "Handle",
           "allreduce", "allreduce_async", "grouped_allreduce", "allgather",
           "allgather_async", "broadcast", "broadcast_async", "alltoall", "reducescatter",
           "barrier", "join", "synchronize", "poll", "broadcast_parameters",
           "broadcast_object", "allgather_object", "DistributedOptimizer", "Compression",
           "elastic"]

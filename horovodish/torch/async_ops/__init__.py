"""The asynchronous torch collectives and their handles: the adapter's bottom layer.

Each call converts tensors to the core's views, submits them, and returns an integer
handle (as Horovod does); ``synchronize(handle)`` waits and returns torch tensors.
Nothing here knows autograd: ``autograd.py`` builds the differentiable blocking forms
on top of these, and ``mpi_ops.py`` (Horovod's module) puts both together.

One module per collective (``allreduce``, ``allgather``, ``broadcast``, ``alltoall``,
``reducescatter``, ``synchronization``), on three shared pieces: ``handle_table`` (the
integer handles, ``poll``, ``synchronize``), ``op_names`` (the negotiated names) and
``tensor_placement`` (where the core reads a call's tensors, and where results go back).
This package gathers their public names.
"""
from ...common.messages import Adasum, Average, Max, Min, Product, Sum  # noqa: F401
from .allgather import allgather_async, allgather_into_async, grouped_allgather_async
from .allreduce import (allreduce_, allreduce_async, allreduce_async_, allreduce_plain_now,
                        grouped_allreduce_, grouped_allreduce_async, grouped_allreduce_async_,
                        grouped_allreduce_into_runtime_async)
from .alltoall import alltoall_async
from .broadcast import broadcast_, broadcast_async, broadcast_async_
from .handle_table import poll, register, synchronize, take
from .op_names import FinalName, names_for
from .reducescatter import grouped_reducescatter_async, reducescatter_async
from .synchronization import barrier, join

__all__ = [
    "Adasum", "Average", "Max", "Min", "Product", "Sum",
    "allgather_async", "allgather_into_async", "grouped_allgather_async",
    "allreduce_", "allreduce_async", "allreduce_async_", "allreduce_plain_now",
    "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_",
    "grouped_allreduce_into_runtime_async", "alltoall_async",
    "broadcast_", "broadcast_async", "broadcast_async_",
    "poll", "register", "synchronize", "take", "FinalName", "names_for",
    "grouped_reducescatter_async", "reducescatter_async", "barrier", "join",
]

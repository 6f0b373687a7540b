"""Tensor names every rank agrees on, in eager code and inside tf.function.

Explicit names are used as given (they must match across ranks). Unnamed eager calls take
the core's per-process counters: every rank makes them in the same order. Inside
tf.function the Python body runs once, at trace time, and the graph then runs many times,
so a graph op's name is fixed when it is traced: a per-graph counter (program order within
the traced function, the same on every rank however many other functions a rank traced).
Nothing from the tensor's own name goes in: ranks whose static shapes differ (allgather,
alltoall) trace different gradient ops, so tensor names differ between ranks. The name
repeats each time the graph runs, which is what lets the core's response cache hit.
"""
from __future__ import annotations

import itertools
import weakref
from typing import Any, Sequence

import tensorflow as tf

from ..common.api import collectives as core
from ..common.api.process_sets import ProcessSet

_graph_counters: "weakref.WeakKeyDictionary[Any, itertools.count]" = weakref.WeakKeyDictionary()


def op_names(name: str | None, tensors: Sequence[Any], opname: str,
             process_set: ProcessSet) -> list[str]:
    """One name per tensor: ``name`` / ``name.i`` if given, else derived as above."""
    count = len(tensors)
    if name is not None:
        return [name] if count == 1 else [f"{name}.{i}" for i in range(count)]
    if tf.executing_eagerly():
        return [core.auto_name(opname, process_set) for _ in range(count)]
    graph = tf.compat.v1.get_default_graph()
    counter = _graph_counters.setdefault(graph, itertools.count())
    prefix = opname if not process_set.process_set_id else f"ps{process_set.process_set_id}.{opname}"
    return [f"{prefix}.graph{next(counter)}" for _ in tensors]


def positional_names(prefix: str, count: int) -> list[str]:
    """Names by position for gradient lists: stable across steps and ranks, and free of
    layer or variable names (Keras numbers those with process-wide counters, which differ
    between ranks that built different numbers of objects)."""
    return [f"{prefix}.{i}" for i in range(count)]

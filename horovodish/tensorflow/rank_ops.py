"""Horovod's layout ops (``size_op``, ``rank_op``, ...) as int32 scalar tensors.

Horovod evaluates them when the graph runs, for elastic jobs whose size changes under a
traced graph. Here ranks never change while a job runs (there is no elastic launcher,
and an elastic reset re-initializes the same ranks), so the value at call time, as a
constant, is the same answer: inside ``tf.function`` it is fixed when the function is
traced.
"""
from __future__ import annotations

import tensorflow as tf

from ..common import api
from ..common.api.process_sets import ProcessSet


def _process_set(process_set_id: int) -> ProcessSet:
    known = api.state().process_sets
    if process_set_id not in known:
        raise ValueError(f"no process set has id {process_set_id}; known ids: "
                         f"{sorted(known)}")
    return known[process_set_id]


def size_op(process_set_id: int = 0, name: str | None = None) -> tf.Tensor:
    """The number of ranks in the process set (0: all of them)."""
    return tf.constant(_process_set(process_set_id).size(), tf.int32, name=name)


def local_size_op(name: str | None = None) -> tf.Tensor:
    return tf.constant(api.local_size(), tf.int32, name=name)


def rank_op(name: str | None = None) -> tf.Tensor:
    return tf.constant(api.rank(), tf.int32, name=name)


def local_rank_op(name: str | None = None) -> tf.Tensor:
    return tf.constant(api.local_rank(), tf.int32, name=name)


def process_set_included_op(process_set_id: int = 0, name: str | None = None) -> tf.Tensor:
    """1 if this rank belongs to the process set, else 0."""
    included = api.rank() in _process_set(process_set_id).ranks
    return tf.constant(int(included), tf.int32, name=name)

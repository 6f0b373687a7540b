"""Variable and object broadcasts for TensorFlow users (same names as Horovod's)."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import tensorflow as tf

from ..common.api import objects
from ..common.api.process_sets import ProcessSet, global_process_set
from .mpi_ops import broadcast_, public


@public
def broadcast_variables(variables: Sequence[Any], root_rank: int,
                        process_set: ProcessSet = global_process_set,
                        inplace: bool = False) -> Any:
    """Give every rank root_rank's values, in one submission (they fuse).

    Takes tf.Variable and Keras 3 ``keras.Variable`` alike (Horovod's ``.ref()``-based
    version fails on the latter). Call it once after building the model and optimizer so
    all ranks start from the same state; every rank must pass the variables in the same
    order. Works eagerly (returns None, done) and inside tf.function; in a
    ``tf.compat.v1`` graph it returns the op to run, as Horovod's does.
    """
    return tf.group(*broadcast_(list(variables), root_rank, process_set=process_set))


@public
def broadcast_global_variables(root_rank: int) -> Any:
    """Broadcast ``tf.compat.v1.global_variables()`` from root_rank: the op for a
    ``tf.compat.v1`` session to run. Eagerly there is no such collection, so this raises
    RuntimeError, as Horovod's does; pass the variables to broadcast_variables instead."""
    if tf.executing_eagerly():
        raise RuntimeError(
            "hvd.broadcast_global_variables() needs a tf.compat.v1 graph: eagerly there are "
            "no global variables. Use hvd.broadcast_variables(model.variables, root_rank) "
            "(and the optimizer's variables) instead.")
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


def broadcast_object(obj: Any, root_rank: int = 0, session: Any = None, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """root_rank's Python object on every rank (cloudpickle; ``session`` is ignored)."""
    return objects.broadcast_object(obj, root_rank, name, process_set)


def broadcast_object_fn(root_rank: int = 0, session: Any = None, name: str | None = None,
                        process_set: ProcessSet = global_process_set) -> Callable[[Any], Any]:
    """A function that broadcasts its argument from root_rank (Horovod's TF1-era helper;
    ``session`` is ignored)."""
    def broadcast(obj: Any) -> Any:
        return objects.broadcast_object(obj, root_rank, name, process_set)
    return broadcast


def allgather_object(obj: Any, session: Any = None, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> list[Any]:
    """Every rank's Python object, in rank order, on every rank."""
    return objects.allgather_object(obj, name, process_set)

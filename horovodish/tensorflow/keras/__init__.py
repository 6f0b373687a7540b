"""Keras adapter: ``import horovodish.tensorflow.keras as hvd``, for Keras 3 and, under
``TF_USE_LEGACY_KERAS=1`` with tf_keras installed, for Keras 2 (keras_flavor.py).

    import horovodish.tensorflow.keras as hvd
    hvd.init()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(1e-3 * hvd.size())),
                  loss="sparse_categorical_crossentropy")
    model.fit(x_shard, y_shard, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                           hvd.callbacks.MetricAverageCallback()])

The value collectives take anything tf.convert_to_tensor takes and return tensors.
"""
from __future__ import annotations

from typing import Any, Sequence

from ...common import api as _api
from ...common.api import *  # noqa: F401,F403  (the names every adapter shares)
from ...common.compression import Compressor
from ...common.messages import ReduceOp
from .. import mpi_ops as _ops
from ..compression import Compression
from ..functions import allgather_object, broadcast_object, broadcast_variables
from ..gradient_reduction import GradientReduction
from ..keras_flavor import keras
from ..mpi_ops import (Adasum, Average, Max, Min, Product, Sum, alltoall, barrier,
                       grouped_allgather, grouped_allreduce, grouped_reducescatter, join)
from . import callbacks
from . import elastic
from .callbacks import broadcast_model_state
from ..sync_batch_norm import SyncBatchNormalization
from .optimizer import (DistributedOptimizer, PartialDistributedOptimizer, configure,
                        distributed_class)


def allreduce(value: Any, name: str | None = None, average: bool | None = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              op: ReduceOp | None = None, compression: Compressor = Compression.none) -> Any:
    """Horovod's Keras argument order; see horovodish.tensorflow.allreduce."""
    return _ops.allreduce(value, average=average, compression=compression, op=op,
                          prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                          name=name)


def allgather(value: Any, name: str | None = None) -> Any:
    return _ops.allgather(value, name=name)


def broadcast(value: Any, root_rank: int, name: str | None = None) -> Any:
    return _ops.broadcast(value, root_rank, name=name)


def reducescatter(value: Any, name: str | None = None, op: ReduceOp = Average) -> Any:
    return _ops.reducescatter(value, op=op, name=name)


def broadcast_global_variables(root_rank: int, model: keras.Model | None = None) -> None:
    """Broadcast model's variables and its optimizer's state from root_rank.

    TensorFlow 2 has no global-variable collection (Horovod's version raises there), so
    name the model; or use BroadcastGlobalVariablesCallback inside model.fit.
    """
    if model is None:
        raise ValueError("TensorFlow 2 has no global variables to find: call "
                         "broadcast_global_variables(root_rank, model=model), "
                         "hvd.broadcast_variables(model.variables, root_rank), or pass "
                         "hvd.callbacks.BroadcastGlobalVariablesCallback(root_rank) to fit().")
    broadcast_model_state(model, root_rank)


def load_model(filepath: str, custom_optimizers: Sequence[type] | None = None,
               custom_objects: dict[str, Any] | None = None,
               compression: Compressor = Compression.none) -> keras.Model:
    """keras.models.load_model, with the saved optimizer (and its state) re-wrapped as a
    DistributedOptimizer. A model saved from a DistributedOptimizer names the wrapped
    class, so plain Keras loads it too (without the reduction)."""
    objects = {cls.__name__: cls for cls in custom_optimizers or ()}
    objects.update(custom_objects or {})
    model = keras.models.load_model(filepath, custom_objects=objects)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None:
        # In place, so the optimizer state that was just loaded is kept.
        optimizer.__class__ = distributed_class(type(optimizer))
        configure(optimizer, GradientReduction(compression=compression,
                                               prefix="DistributedOptimizer"), 1, False)
    return model


__all__ = [*_api.__all__,
    "Adasum", "Average", "Compression", "DistributedOptimizer", "Max", "Min",
    "PartialDistributedOptimizer", "Product", "Sum", "SyncBatchNormalization", "allgather",
    "allgather_object", "allreduce", "alltoall", "barrier", "broadcast",
    "broadcast_global_variables", "broadcast_object", "broadcast_variables", "callbacks",
    "elastic", "grouped_allgather", "grouped_allreduce", "grouped_reducescatter", "join",
    "load_model", "reducescatter",
]

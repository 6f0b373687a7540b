"""``hvd.DistributedOptimizer`` with horovod.tensorflow's arguments.

In TensorFlow >= 2.16 ``tf.keras`` is Keras 3, so a Keras optimizer goes to the Keras
adapter; a TensorFlow 1 style ``tf.compat.v1.train.Optimizer`` gets the wrapper of
legacy_optimizer.py.
"""
from __future__ import annotations

from typing import Any

from ..common.compression import Compressor
from ..common.messages import ReduceOp
from ..common.api.process_sets import ProcessSet, global_process_set
from .compression import Compression


def DistributedOptimizer(optimizer: Any, name: str | None = None, use_locking: bool = False,
                         device_dense: str = "", device_sparse: str = "",
                         compression: Compressor = Compression.none, sparse_as_dense: bool = False,
                         backward_passes_per_step: int = 1, op: ReduceOp = ReduceOp.AVERAGE,
                         gradient_predivide_factor: float = 1.0,
                         average_aggregated_gradients: bool = False, num_groups: int = 0,
                         groups: Any = None,
                         process_set: ProcessSet = global_process_set,
                         scale_local_gradients: bool = True) -> Any:
    """For a Keras optimizer see horovodish.tensorflow.keras.DistributedOptimizer
    (``use_locking`` is ignored); for a ``tf.compat.v1.train.Optimizer``,
    legacy_optimizer.LegacyDistributedOptimizer."""
    import tensorflow as tf

    from .keras_flavor import optimizer_classes
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        return _legacy(optimizer, name, use_locking, compression, sparse_as_dense,
                       backward_passes_per_step, average_aggregated_gradients, op,
                       gradient_predivide_factor,
                       groups if groups is not None else num_groups or None, process_set,
                       scale_local_gradients)
    if not isinstance(optimizer, optimizer_classes()):
        raise NotImplementedError(
            f"DistributedOptimizer wraps Keras optimizers and tf.compat.v1.train "
            f"optimizers, not {type(optimizer).__name__}; for a custom loop use "
            "hvd.DistributedGradientTape.")
    from .keras.optimizer import DistributedOptimizer as keras_distributed
    return keras_distributed(optimizer, name, device_dense, device_sparse, compression,
                             sparse_as_dense, gradient_predivide_factor, op,
                             backward_passes_per_step, average_aggregated_gradients,
                             groups if groups is not None else num_groups or None, process_set,
                             scale_local_gradients=scale_local_gradients)


def _legacy(optimizer: Any, name: str | None, use_locking: bool, compression: Compressor,
            sparse_as_dense: bool, backward_passes_per_step: int,
            average_aggregated_gradients: bool, op: ReduceOp,
            gradient_predivide_factor: float, groups: Any, process_set: ProcessSet,
            scale_local_gradients: bool) -> Any:
    from .gradient_reduction import GradientReduction
    from .legacy_optimizer import LegacyDistributedOptimizer
    name = name or f"Distributed{type(optimizer).__name__}"
    reduction = GradientReduction(op, compression, sparse_as_dense, gradient_predivide_factor,
                                  groups, process_set, prefix=name,
                                  scale_local_gradients=scale_local_gradients)
    return LegacyDistributedOptimizer(optimizer, reduction, name, use_locking,
                                      backward_passes_per_step, average_aggregated_gradients)

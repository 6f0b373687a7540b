"""``hvd.DistributedOptimizer`` with horovod.tensorflow's arguments, for Keras optimizers.

In TensorFlow >= 2.16 ``tf.keras`` is Keras 3, so this hands over to the Keras adapter;
TensorFlow 1 style ``tf.compat.v1.train.Optimizer`` objects are not supported.
"""
from __future__ import annotations

from typing import Any

from ..common.messages import ReduceOp
from ..common.api.process_sets import ProcessSet, global_process_set
from .compression import Compression


def DistributedOptimizer(optimizer: Any, name: str | None = None, use_locking: bool = False,
                         device_dense: str = "", device_sparse: str = "",
                         compression: Any = Compression.none, sparse_as_dense: bool = False,
                         backward_passes_per_step: int = 1, op: ReduceOp = ReduceOp.AVERAGE,
                         gradient_predivide_factor: float = 1.0,
                         average_aggregated_gradients: bool = False, num_groups: int = 0,
                         groups: Any = None,
                         process_set: ProcessSet = global_process_set,
                         scale_local_gradients: bool = True) -> Any:
    """See horovodish.tensorflow.keras.DistributedOptimizer (``use_locking`` is ignored)."""
    import keras
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise NotImplementedError(
            f"DistributedOptimizer wraps Keras optimizers, not {type(optimizer).__name__}; "
            "for a custom loop use hvd.DistributedGradientTape.")
    from .keras.optimizer import DistributedOptimizer as keras_distributed
    return keras_distributed(optimizer, name, device_dense, device_sparse, compression,
                             sparse_as_dense, gradient_predivide_factor, op,
                             backward_passes_per_step, average_aggregated_gradients,
                             groups if groups is not None else num_groups or None, process_set,
                             scale_local_gradients=scale_local_gradients)

"""SyncBatchNormalization: Keras batch normalization over the global batch.

In training, each rank sums its inputs, their squares and their count per channel, and
one allreduce (Sum) of the three gives every rank the global batch's mean and variance;
normalization, the moving statistics and everything else stay Keras's own. The
allreduce is differentiable (its gradient is the allreduce of the upstream gradients),
so the gradients include every rank's contribution through the shared statistics: with
DistributedGradientTape or DistributedOptimizer (Average) they equal one process's on
the whole batch.
"""
from __future__ import annotations

from typing import Any

import tensorflow as tf

from ..common.messages import ReduceOp
from ..common.api.process_sets import ProcessSet, global_process_set
from . import errors
from .keras_flavor import KERAS_2, keras, register_serializable
from .mpi_ops import _allreduce
from .naming import op_names


@register_serializable(package="horovodish")
class SyncBatchNormalization(keras.layers.BatchNormalization):
    """``keras.layers.BatchNormalization`` whose training statistics span all ranks of
    ``process_set``. Inference uses the moving statistics, as usual. Not under XLA (the
    layer says so, so ``jit_compile="auto"`` stays off)."""

    def __init__(self, *args: Any, process_set: ProcessSet = global_process_set,
                 **kwargs: Any) -> None:
        if kwargs.get("synchronized"):
            raise ValueError("SyncBatchNormalization synchronizes through horovodish; "
                             "synchronized=True is tf.distribute's and does not apply")
        if kwargs.pop("fused", None):  # Horovod's takes fused=False/None, refuses True
            raise ValueError("SyncBatchNormalization has no fused kernel; pass fused=False")
        if KERAS_2:  # its fused kernel would compute the statistics itself
            kwargs["fused"] = False
        super().__init__(*args, **kwargs)
        self._hvd_process_set = process_set
        self.supports_jit = False

    if KERAS_2:
        def _calculate_mean_and_var(self, inputs: Any, reduction_axes: Any,
                                    keep_dims: bool, mask: Any = None) -> tuple[Any, Any]:
            """Keras 2's hook for the batch statistics."""
            if errors.resolve(self._hvd_process_set).size() == 1:
                return super()._calculate_mean_and_var(inputs, reduction_axes, keep_dims,
                                                       mask=mask)
            mean, variance = self._global_moments(inputs, list(reduction_axes), mask)
            if keep_dims:
                shape = [1 if i in reduction_axes else d
                         for i, d in enumerate(tf.unstack(tf.shape(inputs)))]
                mean, variance = tf.reshape(mean, shape), tf.reshape(variance, shape)
            return mean, variance
    else:
        def _moments(self, inputs: Any, mask: Any) -> tuple[Any, Any]:
            """Keras 3's hook for the batch statistics."""
            if errors.resolve(self._hvd_process_set).size() == 1:
                return super()._moments(inputs, mask)
            return self._global_moments(inputs, self._reduction_axes, mask)

    def _global_moments(self, inputs: Any, axes: Any, mask: Any) -> tuple[Any, Any]:
        process_set = errors.resolve(self._hvd_process_set)
        # Sums in float64: the variance is E[x^2] - E[x]^2, which cancels badly in float32
        # when the mean is large against the spread (1000 +- 0.1: 0.25 for 0.01).
        dtype = inputs.dtype
        inputs = tf.cast(inputs, tf.float64)
        if mask is None:
            shape = tf.shape(inputs)
            count = tf.cast(tf.reduce_prod(tf.gather(shape, axes)), inputs.dtype)
            summed = tf.reduce_sum(inputs, axes)
            squares = tf.reduce_sum(tf.square(inputs), axes)
            counts = tf.fill(tf.shape(summed), count)
        else:
            weights = tf.cast(tf.broadcast_to(tf.expand_dims(mask, -1), tf.shape(inputs)),
                              inputs.dtype)
            summed = tf.reduce_sum(inputs * weights, axes)
            squares = tf.reduce_sum(tf.square(inputs) * weights, axes)
            counts = tf.reduce_sum(weights, axes)
        # One collective for the three: stacked on a new first axis.
        stacked = tf.stack([summed, squares, counts])
        total = _allreduce([stacked], ReduceOp.SUM, 1.0, 1.0,
                           op_names(None, [stacked], "sync_batch_norm", process_set),
                           process_set)[0]
        summed, squares, counts = total[0], total[1], total[2]
        if mask is not None:  # Keras's own guard against channels with no weight
            counts = counts + keras.backend.epsilon()
        mean = summed / counts
        # E[x^2] - E[x]^2 can still dip below zero by rounding.
        variance = tf.maximum(squares / counts - tf.square(mean), 0.0)
        return tf.cast(mean, dtype), tf.cast(variance, dtype)

"""DistributedGradientTape: a tf.GradientTape whose gradient() returns reduced gradients."""
from __future__ import annotations

from typing import Any

import tensorflow as tf

from ..common.messages import ReduceOp
from ..common.process_sets import ProcessSet, global_process_set
from .compression import Compression
from .gradient_reduction import GradientReduction


class _DistributedTapeMixin:
    _hvd_reduction: GradientReduction

    @tf.autograph.experimental.do_not_convert
    def gradient(self, target: Any, sources: Any, output_gradients: Any = None,
                 unconnected_gradients: Any = tf.UnconnectedGradients.NONE) -> Any:
        grads = super().gradient(target, sources, output_gradients,  # type: ignore[misc]
                                 unconnected_gradients)
        flat_sources = tf.nest.flatten(sources)
        reduced = self._hvd_reduction(tf.nest.flatten(grads), flat_sources)
        return tf.nest.pack_sequence_as(grads, reduced)


def DistributedGradientTape(gradtape: tf.GradientTape, device_dense: str = "",
                            device_sparse: str = "", compression: Any = Compression.none,
                            sparse_as_dense: bool = False, op: ReduceOp = ReduceOp.AVERAGE,
                            gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                            groups: Any = None,
                            process_set: ProcessSet = global_process_set) -> tf.GradientTape:
    """Wrap a tape so that ``gradient()`` averages (op) the gradients across ranks.

        with tf.GradientTape() as tape:
            loss = loss_fn(model(x), y)
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)   # same on every rank

    All gradients are submitted together, so they fuse; ``groups`` (an int, or lists of
    variables) splits that submission as in Horovod (``num_groups`` is its old name).
    Works eagerly and inside tf.function (not under jit_compile). IndexedSlices gradients
    are allgathered, or densified first with ``sparse_as_dense=True``.
    ``gradient_predivide_factor`` f (op=Average only) scales by 1/f before the sum and
    f/size after it. The returned tape shares the wrapped tape's recording.
    """
    reduction = GradientReduction(op, compression, sparse_as_dense, gradient_predivide_factor,
                                  groups if groups is not None else num_groups or None,
                                  process_set, "DistributedGradientTape")
    base = type(gradtape)
    cls = type(base.__name__, (_DistributedTapeMixin, base), {})
    tape = cls.__new__(cls)
    tape.__dict__.update(gradtape.__dict__)
    tape._recording = False  # recording stays with the wrapped tape's `with` block
    tape._hvd_reduction = reduction
    return tape

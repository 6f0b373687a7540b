"""DistributedGradientTape: a tf.GradientTape whose gradient() returns reduced gradients."""
from __future__ import annotations

from typing import Any

import tensorflow as tf

from ..common.compression import Compressor
from ..common.messages import ReduceOp
from ..common.api.process_sets import ProcessSet, global_process_set
from .compression import Compression
from .gradient_reduction import GradientReduction


class _DistributedTapeMixin:
    _hvd_reduction: GradientReduction
    _hvd_local: set[int]

    def register_local_source(self, source: Any) -> None:
        """Keep source's gradient on this rank (not reduced); see
        PartialDistributedGradientTape."""
        self._hvd_local.add(id(source))

    @tf.autograph.experimental.do_not_convert
    def gradient(self, target: Any, sources: Any, output_gradients: Any = None,
                 unconnected_gradients: Any = tf.UnconnectedGradients.NONE,
                 use_generic_names: bool = False) -> Any:
        # use_generic_names: Horovod's switch to names by position, which ours always are.
        grads = super().gradient(target, sources, output_gradients,  # type: ignore[misc]
                                 unconnected_gradients)
        flat_sources = tf.nest.flatten(sources)
        reduced = self._hvd_reduction(tf.nest.flatten(grads), flat_sources, self._hvd_local)
        return tf.nest.pack_sequence_as(grads, reduced)

    def get_local_and_global_gradients(self, target: Any, sources: Any,
                                       output_gradients: Any = None,
                                       use_generic_names: bool = False
                                       ) -> tuple[list[tuple[Any, Any]], list[tuple[Any, Any]]]:
        """``gradient()``'s results split as Horovod's are: (source, gradient) pairs of
        the local sources, then of the reduced ones, each in the order of sources."""
        flat_sources = tf.nest.flatten(sources)
        grads = tf.nest.flatten(self.gradient(target, sources, output_gradients))
        pairs = list(zip(flat_sources, grads))
        return ([p for p in pairs if id(p[0]) in self._hvd_local],
                [p for p in pairs if id(p[0]) not in self._hvd_local])


def DistributedGradientTape(gradtape: tf.GradientTape, device_dense: str = "",
                            device_sparse: str = "", compression: Compressor = Compression.none,
                            sparse_as_dense: bool = False, op: ReduceOp = ReduceOp.AVERAGE,
                            gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                            groups: Any = None,
                            process_set: ProcessSet = global_process_set,
                            scale_local_gradients: bool = True) -> tf.GradientTape:
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
    ``register_local_source(variable)`` keeps a variable's gradient local (see
    PartialDistributedGradientTape).
    """
    reduction = GradientReduction(op, compression, sparse_as_dense, gradient_predivide_factor,
                                  groups if groups is not None else num_groups or None,
                                  process_set, "DistributedGradientTape",
                                  scale_local_gradients)
    base = type(gradtape)
    cls = type(base.__name__, (_DistributedTapeMixin, base), {})
    tape = cls.__new__(cls)
    tape.__dict__.update(gradtape.__dict__)
    tape._recording = False  # recording stays with the wrapped tape's `with` block
    tape._hvd_reduction = reduction
    tape._hvd_local = set()
    return tape


def local_layer_variables(local_layers: Any) -> list[Any]:
    """The trainable variables of a layer or of a collection of layers."""
    # only here: horovodish.tensorflow works without touching Keras
    from .keras_flavor import keras

    if local_layers is None:
        return []
    if isinstance(local_layers, keras.layers.Layer):
        local_layers = [local_layers]
    layers = list(local_layers)
    wrong = [type(layer).__name__ for layer in layers if not isinstance(layer, keras.layers.Layer)]
    if wrong:
        raise ValueError(f"local_layers must be Keras layers; got {', '.join(wrong)}")
    return [variable for layer in layers for variable in layer.trainable_weights]


def PartialDistributedGradientTape(gradtape: tf.GradientTape, device_dense: str = "",
                                   device_sparse: str = "",
                                   compression: Compressor = Compression.none,
                                   sparse_as_dense: bool = False,
                                   op: ReduceOp = ReduceOp.AVERAGE,
                                   gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                                   groups: Any = None,
                                   process_set: ProcessSet = global_process_set,
                                   local_layers: Any = None,
                                   scale_local_gradients: bool = True) -> tf.GradientTape:
    """DistributedGradientTape that leaves the gradients of ``local_layers`` (a Keras layer
    or a collection of them) on each rank: they are not reduced, and are divided by the
    number of ranks when ``scale_local_gradients`` (Horovod's default, whatever the op:
    it offsets a learning rate scaled by the number of ranks, the usual convention, which
    a layer trained on one rank's data alone should not get). Every rank must pass the
    same layers (by position in the sources).
    """
    tape = DistributedGradientTape(gradtape, device_dense, device_sparse, compression,
                                   sparse_as_dense, op, gradient_predivide_factor, num_groups,
                                   groups, process_set, scale_local_gradients)
    for variable in local_layer_variables(local_layers):
        tape.register_local_source(variable)
    return tape

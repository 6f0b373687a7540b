"""``hvd.DistributedOptimizer`` around a TensorFlow 1 style ``tf.compat.v1.train.Optimizer``.

Scripts written for ``tf.compat.v1`` sessions (``MonitoredTrainingSession``,
``optimizer.minimize(loss)``) wrap such an optimizer, as with Horovod: its
``compute_gradients`` returns the gradients reduced across the ranks (one grouped
submission, see gradient_reduction.py), and everything else is the wrapped optimizer's.
``minimize`` comes from the base class, so it runs through both. Works in a graph
(each ``session.run`` of the step reduces that step's gradients) and eagerly; with
``backward_passes_per_step > 1`` in a graph only, as Horovod's (graph_accumulation.py).
"""
from __future__ import annotations

from typing import Any

import tensorflow as tf

from .gradient_reduction import GradientReduction
from .graph_accumulation import GraphAccumulation


class LegacyDistributedOptimizer(tf.compat.v1.train.Optimizer):
    """What ``hvd.DistributedOptimizer`` returns for a ``tf.compat.v1.train.Optimizer``."""

    def __init__(self, optimizer: Any, reduction: GradientReduction, name: str | None = None,
                 use_locking: bool = False, backward_passes_per_step: int = 1,
                 average_aggregated_gradients: bool = False) -> None:
        name = name or f"Distributed{type(optimizer).__name__}"
        super().__init__(name=name, use_locking=use_locking)
        self._optimizer = optimizer
        self._reduce = reduction
        self._local_vars: set[int] = set()
        self._accumulation: GraphAccumulation | None = None
        if backward_passes_per_step > 1:
            if tf.executing_eagerly():
                raise ValueError("backward_passes_per_step > 1 is not yet supported for a "
                                 "tf.compat.v1.train optimizer with eager execution (as in "
                                 "Horovod); build the step in a graph, or use a Keras "
                                 "optimizer, whose wrapper accumulates eagerly too.")
            self._accumulation = GraphAccumulation(
                backward_passes_per_step, average_aggregated_gradients,
                reduction.sparse_as_dense, name)

    def register_local_var(self, var: Any) -> None:
        """Keep var's gradient on this rank (divided by the set's size unless
        ``scale_local_gradients=False``), as Horovod's local variables."""
        self._local_vars.add(id(var))

    def compute_gradients(self, *args: Any, **kwargs: Any) -> list[tuple[Any, Any]]:
        """The wrapped optimizer's gradients, reduced across the ranks (None stays None)."""
        pairs = list(self._optimizer.compute_gradients(*args, **kwargs))
        if not pairs:
            return pairs
        grads, variables = zip(*pairs)
        if self._accumulation is not None:
            present = [v for g, v in pairs if g is not None]
            reduced = self._accumulation.gradients(
                grads, lambda sums: self._reduce(sums, present, local=self._local_vars))
        else:
            reduced = self._reduce(list(grads), list(variables), local=self._local_vars)
        return list(zip(reduced, variables))

    def apply_gradients(self, grads_and_vars: Any, global_step: Any = None,
                        name: str | None = None) -> Any:
        if self._accumulation is not None:
            pairs = list(grads_and_vars)
            return self._accumulation.apply(
                lambda: self._optimizer.apply_gradients(pairs, global_step=global_step,
                                                        name=name),
                self._optimizer, [g for g, _ in pairs], global_step)
        return self._optimizer.apply_gradients(grads_and_vars, global_step=global_step,
                                               name=name)

    def get_slot(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.variables(*args, **kwargs)

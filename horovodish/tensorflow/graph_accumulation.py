"""``backward_passes_per_step > 1`` for a TensorFlow 1 optimizer in a graph, as Horovod's.

Each pass adds its gradients into local variables and counts itself; the pass that makes
the count ``passes`` reduces the sums across the ranks (divided by ``passes`` when
``average_aggregated_gradients``) and sets the count back to 0; the other passes return
their own gradients unreduced. Applying runs the wrapped optimizer only on the pass that
reduced; the others still advance ``global_step`` (and a Keras-style ``iterations``),
so that step counts go on as without accumulation. Every rank runs the same passes,
so every rank takes the same branch of each ``tf.cond``: the reduction inside it meets.
Graphs only: eagerly Horovod refuses it, and so does this.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import tensorflow as tf

from . import ops

v1 = tf.compat.v1


class GraphAccumulation:
    """The counter and the gradients' sums of one wrapped optimizer in one graph."""

    def __init__(self, passes: int, average: bool, sparse_as_dense: bool, name: str) -> None:
        if passes < 1:
            raise ValueError(f"backward_passes_per_step must be >= 1, got {passes}")
        self.passes = passes
        self.average = average
        self.sparse_as_dense = sparse_as_dense
        self.name = name
        self.counter: Any = None

    def gradients(self, grads: Sequence[Any], reduce: Callable[[list[Any]], list[Any]]
                  ) -> list[Any]:
        """This pass's gradients (None stays None): reduce(sums) on the last pass of each
        ``passes``, else the pass's own."""
        present = [index for index, grad in enumerate(grads) if grad is not None]
        dense = [self._dense(grads[index]) for index in present]
        sums = self._variables(dense)
        counter = self.counter
        first = tf.cond(tf.equal(counter, 0),
                        lambda: tf.group(*[s.assign(tf.zeros_like(s)) for s in sums]),
                        tf.no_op)
        with tf.control_dependencies([first]):
            added = tf.group(*[s.assign_add(g) for s, g in zip(sums, dense)])
        with tf.control_dependencies([added]):
            counted = counter.assign_add(1)

        def reduce_sums() -> list[Any]:
            reduced = reduce([s.read_value() for s in sums])
            with tf.control_dependencies([r for r in reduced if r is not None]):
                reset = counter.assign(0)
            with tf.control_dependencies([reset]):
                divisor = float(self.passes if self.average else 1)
                return [tf.identity(r) if divisor == 1 else r / tf.cast(divisor, r.dtype)
                        for r in reduced]

        with tf.control_dependencies([counted]):
            # One link of the graph's chain of collectives (ops.py): the branch's
            # collective is ordered against those built before and after it.
            chosen = ops.as_one_link(lambda: tf.cond(
                tf.equal(counted, self.passes), reduce_sums,
                lambda: [tf.identity(g) for g in dense]))
        chosen = list(chosen) if isinstance(chosen, (list, tuple)) else [chosen]
        result: list[Any] = [None] * len(grads)
        for index, grad in zip(present, chosen):
            result[index] = grad
        return result

    def apply(self, apply_now: Callable[[], Any], optimizer: Any,
              grads: Sequence[Any], global_step: Any = None) -> Any:
        """apply_now() on the pass that reduced; otherwise count the step only."""
        if self.counter is None:
            raise ValueError("apply_gradients with backward_passes_per_step > 1 needs the "
                             "wrapper's compute_gradients first (minimize() calls both): "
                             "the passes are counted there.")
        def count_iteration() -> Any:
            iterations = getattr(optimizer, "iterations", None)
            return iterations.assign_add(1).op if iterations is not None else tf.no_op()

        def count_global_step() -> Any:
            if global_step is None:
                return tf.no_op()
            return global_step.assign_add(tf.constant(1, global_step.dtype.base_dtype),
                                          use_locking=True, read_value=False)

        with tf.control_dependencies([g for g in grads if g is not None]):
            reduced_now = tf.equal(self.counter, 0)  # read once this pass has counted
            applied = tf.cond(reduced_now, apply_now, count_iteration)
        with tf.control_dependencies([applied]):
            return tf.cond(reduced_now, tf.no_op, count_global_step)

    def _dense(self, grad: Any) -> Any:
        if isinstance(grad, tf.IndexedSlices):
            if not self.sparse_as_dense:
                raise ValueError("IndexedSlices are not supported when "
                                 "`backward_passes_per_step` > 1 and `sparse_as_dense` is "
                                 "False; pass sparse_as_dense=True.")
            return tf.convert_to_tensor(grad)
        return grad

    def _variables(self, grads: list[Any]) -> list[Any]:
        """The counter and one sum per gradient: local variables (MonitoredSession and
        ``tf.compat.v1.local_variables_initializer`` initialize them), made once per
        graph and found again by name on later calls."""
        with v1.variable_scope(f"{self.name}_accumulation", reuse=v1.AUTO_REUSE):
            self.counter = v1.get_variable(
                "counter", shape=(), dtype=tf.int32, trainable=False,
                initializer=v1.zeros_initializer(),
                collections=[v1.GraphKeys.LOCAL_VARIABLES])
            return [v1.get_variable(
                f"sum_{index}", shape=grad.shape, dtype=grad.dtype, trainable=False,
                initializer=v1.zeros_initializer(),
                collections=[v1.GraphKeys.LOCAL_VARIABLES])
                for index, grad in enumerate(grads)]

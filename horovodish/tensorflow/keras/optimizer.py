"""DistributedOptimizer for Keras 3: reduce gradients where Keras 3 really applies them.

Horovod's Keras wrapper overrides ``get_gradients``/``_aggregate_gradients``, which Keras 3
never calls, so under ``model.fit`` it trains each rank on its own gradients without a
word. Every Keras 3 update goes through ``Optimizer.apply`` (``model.fit``'s TF
train_step calls ``apply_gradients``, which calls ``apply``; custom loops call either),
so that is the one method overridden, in a subclass of the wrapped optimizer's own class.
"""
from __future__ import annotations

from typing import Any, Sequence

import keras
import tensorflow as tf

from ...common.messages import ReduceOp
from ...common.api.process_sets import ProcessSet, global_process_set
from ..compression import Compression
from ..gradient_reduction import GradientReduction
from ..gradient_tape import local_layer_variables

_classes: dict[type, type] = {}


class _Accumulation:
    """backward_passes_per_step's local sums and pass counter. A plain holder, so that
    Keras does not track them as optimizer variables: they are per rank (a broadcast of
    the optimizer's variables overwrote a rank's partial sums with the root's) and not
    part of the optimizer's state (a saved model had 3 more variables than the optimizer
    it loads into, and Keras dropped the whole optimizer state on load)."""

    def __init__(self, variables: Sequence[Any]) -> None:
        self.sums = [keras.Variable(initializer="zeros", shape=v.shape, dtype=v.dtype,
                                    trainable=False, name="hvd_accumulated")
                     for v in variables]
        self.passes = keras.Variable(initializer="zeros", shape=(), dtype="int64",
                                     trainable=False, name="hvd_backward_passes")


class _DistributedOptimizerMixin:
    """Goes first in the MRO, before the wrapped optimizer's class."""

    _hvd_reduction = GradientReduction(prefix="DistributedOptimizer")
    _hvd_passes = 1
    _hvd_average_aggregated = False
    # ids of variables whose gradients stay local; a frozenset, replaced on change, so
    # that Keras does not track it and no two optimizers share one
    _hvd_local: frozenset[int] = frozenset()

    def register_local_var(self, var: Any) -> None:
        """Keep var's gradient on this rank (see PartialDistributedOptimizer)."""
        self._hvd_local = self._hvd_local | {id(var)}

    def build(self, variables: Sequence[Any]) -> None:
        super().build(variables)  # type: ignore[misc]
        if self._hvd_passes > 1 and getattr(self, "_hvd_accumulation", None) is None:
            self._hvd_accumulation = _Accumulation(variables)

    def apply(self, grads: Sequence[Any], trainable_variables: Sequence[Any] | None = None) -> Any:
        grads = list(grads)
        variables = list(trainable_variables) if trainable_variables is not None else \
            getattr(self, "_trainable_variables", None) or None
        if self._hvd_passes == 1:
            return super().apply(  # type: ignore[misc]
                self._hvd_reduce(grads, variables), trainable_variables)
        return self._hvd_accumulate(grads, variables)

    def _hvd_reduce(self, grads: list[Any], variables: list[Any] | None) -> list[Any]:
        """A loss scaler's overflow check (ours under mixed_float16) must agree across
        ranks: it does on reduced gradients; local ones are made to agree."""
        return self._hvd_reduction(grads, variables, self._hvd_local, agree_on_overflow=bool(
            self._hvd_local) and isinstance(self, keras.optimizers.LossScaleOptimizer))

    def _hvd_accumulate(self, grads: list[Any], variables: list[Any] | None) -> None:
        """Sum backward_passes_per_step local gradients, then reduce and apply once; the
        other steps only advance ``iterations`` (as Horovod does)."""
        if variables is None:
            raise ValueError("DistributedOptimizer: pass the variables with the first "
                             "gradients (apply_gradients(zip(grads, vars))).")
        if not self.built:
            with keras.name_scope(self.name, caller=self):
                self.build(variables)
        accumulation = self._hvd_accumulation
        accumulators = [accumulation.sums[self._get_variable_index(v)] for v in variables]
        for grad, accumulator in zip(grads, accumulators):
            if isinstance(grad, tf.IndexedSlices):
                if not self._hvd_reduction.sparse_as_dense:
                    raise ValueError("IndexedSlices gradients with backward_passes_per_step > 1 "
                                     "need sparse_as_dense=True.")
                grad = tf.convert_to_tensor(grad)
            if grad is not None:
                accumulator.assign_add(tf.cast(grad, accumulator.dtype))
        accumulation.passes.assign_add(1)
        apply = super().apply  # type: ignore[misc]
        present = [g is not None for g in grads]

        def reduce_and_apply() -> None:
            summed = [tf.convert_to_tensor(a) if p else None
                      for a, p in zip(accumulators, present)]
            # Start the next round before reducing: a reduction that fails (a lost peer,
            # which hvd.elastic.run recovers from) then drops this round's sums like a
            # skipped step, rather than leaving the counter past its mark for good.
            for accumulator in accumulators:
                accumulator.assign(tf.zeros_like(accumulator))
            accumulation.passes.assign(0)
            reduced = self._hvd_reduce(summed, variables)
            if self._hvd_average_aggregated:
                reduced = [g / self._hvd_passes if g is not None else None for g in reduced]
            apply(reduced, variables)

        def skip() -> None:
            # iterations, not _iterations: a LossScaleOptimizer's own counter is unused
            # (its iterations are the inner optimizer's), and schedules read the latter.
            self.iterations.assign_add(1)

        tf.cond(accumulation.passes >= self._hvd_passes, reduce_and_apply, skip)


def distributed_class(base: type) -> type:
    """The wrapped class: same name and module as base, so a saved model names base and
    loads without horovodish (load_model() below re-wraps it)."""
    base = getattr(base, "_hvd_base", base)
    if base not in _classes:
        _classes[base] = type(base.__name__, (_DistributedOptimizerMixin, base),
                              {"__module__": base.__module__, "_hvd_base": base})
    return _classes[base]


def configure(optimizer: Any, reduction: GradientReduction, backward_passes_per_step: int,
              average_aggregated_gradients: bool) -> Any:
    """Make optimizer (an instance of a distributed_class) reduce with these settings."""
    if backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be >= 1, got {backward_passes_per_step}")
    optimizer._hvd_reduction = reduction
    optimizer._hvd_passes = int(backward_passes_per_step)
    optimizer._hvd_average_aggregated = bool(average_aggregated_gradients)
    return optimizer


def DistributedOptimizer(optimizer: Any, name: str | None = None, device_dense: str = "",
                         device_sparse: str = "", compression: Any = Compression.none,
                         sparse_as_dense: bool = False, gradient_predivide_factor: float = 1.0,
                         op: ReduceOp = ReduceOp.AVERAGE, backward_passes_per_step: int = 1,
                         average_aggregated_gradients: bool = False, groups: Any = None,
                         process_set: ProcessSet = global_process_set,
                         num_groups: int = 0, scale_local_gradients: bool = True) -> Any:
    """A copy of a Keras 3 optimizer that averages (op) gradients across ranks.

        opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01 * hvd.size()))
        model.compile(optimizer=opt, loss=...)      # jit_compile must stay off
        model.fit(x_shard, y_shard, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])

    Contract: every rank wraps the same optimizer for the same model and steps together;
    after each update the weights are identical on every rank if they started so (use
    BroadcastGlobalVariablesCallback or broadcast_variables). The copy is built fresh from
    ``optimizer.get_config()`` (state is not carried over, as in Horovod). Reduction
    happens before clipping and weight decay. With ``backward_passes_per_step`` k > 1,
    gradients are summed locally for k steps and reduced and applied on the k-th
    (divided by k only if ``average_aggregated_gradients``); the other steps just advance
    ``iterations``. ``gradient_predivide_factor`` f (op=Average): 1/f before the sum,
    f/size after it. Under the mixed_float16 policy the result wraps a LossScaleOptimizer
    (as compile() would), so every rank sees the same reduced gradients when it checks
    for overflow. ``num_groups`` is ``groups``' old name (an int), as in Horovod.
    ``register_local_var(variable)`` keeps a variable's gradient local (see
    PartialDistributedOptimizer; ``scale_local_gradients`` applies to those).
    """
    _require_optimizer(optimizer)
    reduction = GradientReduction(op, compression, sparse_as_dense, gradient_predivide_factor,
                                  groups if groups is not None else num_groups or None,
                                  process_set, "DistributedOptimizer", scale_local_gradients)
    if (keras.config.dtype_policy().name == "mixed_float16"
            and not isinstance(optimizer, keras.optimizers.LossScaleOptimizer)):
        # compile() would wrap us in one; its overflow check is per rank, so a rank could
        # skip the update (and our allreduce) that the others make. Reduce outside it.
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    config = optimizer.get_config()
    if name is not None:
        config["name"] = name
    wrapped = distributed_class(type(optimizer)).from_config(config)
    return configure(wrapped, reduction, backward_passes_per_step, average_aggregated_gradients)


def _require_optimizer(optimizer: Any) -> None:
    """A clear error for a name or a class where an optimizer instance belongs."""
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        given = repr(optimizer) if isinstance(optimizer, str) else \
            f"the class {optimizer.__name__}" if isinstance(optimizer, type) else \
            f"a {type(optimizer).__name__}"
        raise TypeError("DistributedOptimizer wraps a keras.optimizers.Optimizer instance, "
                        f"not {given}; pass e.g. keras.optimizers.Adam(...) or "
                        "keras.optimizers.get('adam').")


def PartialDistributedOptimizer(optimizer: Any, name: str | None = None, device_dense: str = "",
                                device_sparse: str = "", compression: Any = Compression.none,
                                sparse_as_dense: bool = False,
                                gradient_predivide_factor: float = 1.0,
                                op: ReduceOp = ReduceOp.AVERAGE,
                                backward_passes_per_step: int = 1,
                                average_aggregated_gradients: bool = False, groups: Any = None,
                                process_set: ProcessSet = global_process_set,
                                local_layers: Any = None,
                                scale_local_gradients: bool = True) -> Any:
    """DistributedOptimizer that leaves the gradients of ``local_layers`` (a Keras layer or
    a collection of them) on each rank, divided by the number of ranks when
    ``scale_local_gradients`` (see PartialDistributedGradientTape)."""
    wrapped = DistributedOptimizer(optimizer, name, device_dense, device_sparse, compression,
                                   sparse_as_dense, gradient_predivide_factor, op,
                                   backward_passes_per_step, average_aggregated_gradients,
                                   groups, process_set,
                                   scale_local_gradients=scale_local_gradients)
    for variable in local_layer_variables(local_layers):
        wrapped.register_local_var(variable)
    return wrapped

"""DistributedOptimizer for Keras: reduce gradients where each Keras really applies them.

Keras 3: every update goes through ``Optimizer.apply`` (``model.fit``'s TF train_step
calls ``apply_gradients``, which calls ``apply``; custom loops call either), so that is
the one method overridden (Horovod's wrapper overrides ``get_gradients`` and
``_aggregate_gradients``, which Keras 3 never calls: under ``model.fit`` it trained each
rank on its own gradients without a word). Keras 2 (tf_keras, see keras_flavor.py):
``minimize`` (what ``model.fit`` calls) and custom loops end in ``apply_gradients``,
which is overridden; OptimizerV2's graph-mode ``get_updates`` path reduces in
``get_gradients`` instead, and its ``apply_gradients`` then applies them as they are.
Either way the override lives in a subclass of the wrapped optimizer's own class.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import tensorflow as tf

from ...common.compression import Compressor
from ...common.messages import ReduceOp
from ...common.api.process_sets import ProcessSet, global_process_set
from ..compression import Compression
from ..gradient_reduction import GradientReduction
from ..gradient_tape import local_layer_variables
from ..keras_flavor import (KERAS_2, NAME, build_optimizer, keras, mixed_float16,
                            optimizer_built, optimizer_classes, other_keras_optimizer)

_classes: dict[type, type] = {}

Apply = Callable[[list[Any], list[Any]], Any]


class _Accumulation:
    """backward_passes_per_step's local sums and pass counter. A plain holder, so that
    Keras does not track them as optimizer variables: they are per rank (a broadcast of
    the optimizer's variables overwrote a rank's partial sums with the root's) and not
    part of the optimizer's state (a saved model had 3 more variables than the optimizer
    it loads into, and Keras dropped the whole optimizer state on load). Sums are found
    by the variable object they belong to."""

    def __init__(self, variables: Sequence[Any]) -> None:
        with tf.init_scope():
            self.sums = [tf.Variable(tf.zeros(v.shape, dtype=v.dtype), trainable=False,
                                     name="hvd_accumulated") for v in variables]
            self.passes = tf.Variable(tf.constant(0, tf.int64), trainable=False,
                                      name="hvd_backward_passes")
        self.index = {id(v): i for i, v in enumerate(variables)}

    @property
    def counter(self) -> Any:
        """The passes summed since the last update (Horovod's name)."""
        return self.passes

    def sums_of(self, variables: Sequence[Any]) -> list[Any]:
        missing = [v.name for v in variables if id(v) not in self.index]
        if missing:
            raise ValueError("DistributedOptimizer with backward_passes_per_step > 1: "
                             f"gradients for variables it was not first given ({missing}); "
                             "pass the same variables to every step.")
        return [self.sums[self.index[id(v)]] for v in variables]


class _DistributedOptimizerMixin:
    """What both Keras' wrappers share; goes first in the MRO, before the wrapped
    optimizer's class."""

    _hvd_reduction = GradientReduction(prefix="DistributedOptimizer")
    _hvd_passes = 1
    _hvd_average_aggregated = False
    _hvd_accumulation: _Accumulation | None = None
    # ids of variables whose gradients stay local; a frozenset, replaced on change, so
    # that Keras does not track it and no two optimizers share one
    _hvd_local: frozenset[int] = frozenset()

    def register_local_var(self, var: Any) -> None:
        """Keep var's gradient on this rank (see PartialDistributedOptimizer)."""
        self._hvd_local = self._hvd_local | {id(var)}

    def _hvd_reduce(self, grads: list[Any], variables: list[Any] | None) -> list[Any]:
        """A loss scaler's overflow check (ours under mixed_float16) must agree across
        ranks: it does on reduced gradients; local ones are made to agree."""
        scaled = not KERAS_2 and isinstance(self, keras.optimizers.LossScaleOptimizer)
        return self._hvd_reduction(grads, variables, self._hvd_local,
                                   agree_on_overflow=bool(self._hvd_local) and scaled)

    def _hvd_apply(self, grads: list[Any], variables: list[Any] | None, apply: Apply) -> Any:
        if self._hvd_passes == 1:
            return apply(self._hvd_reduce(grads, variables), variables)
        return self._hvd_accumulate(grads, variables, apply)

    def _hvd_accumulate(self, grads: list[Any], variables: list[Any] | None,
                        apply: Apply) -> None:
        """Sum backward_passes_per_step local gradients, then reduce and apply once; the
        other steps only advance ``iterations`` (as Horovod does)."""
        if variables is None:
            raise ValueError("DistributedOptimizer: pass the variables with the first "
                             "gradients (apply_gradients(zip(grads, vars))).")
        if not optimizer_built(self):  # not inside the tf.cond below
            build_optimizer(self, variables)
        if self._hvd_accumulation is None:
            self._hvd_accumulation = _Accumulation(variables)
        accumulation = self._hvd_accumulation
        accumulators = accumulation.sums_of(variables)
        for grad, accumulator in zip(grads, accumulators):
            if isinstance(grad, tf.IndexedSlices):
                if not self._hvd_reduction.sparse_as_dense:
                    raise ValueError("IndexedSlices gradients with backward_passes_per_step > 1 "
                                     "need sparse_as_dense=True.")
                grad = tf.convert_to_tensor(grad)
            if grad is not None:
                accumulator.assign_add(tf.cast(grad, accumulator.dtype))
        accumulation.passes.assign_add(1)
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


class _Keras3Mixin(_DistributedOptimizerMixin):
    def apply(self, grads: Sequence[Any], trainable_variables: Sequence[Any] | None = None) -> Any:
        variables = list(trainable_variables) if trainable_variables is not None else \
            getattr(self, "_trainable_variables", None) or None
        return self._hvd_apply(list(grads), variables,
                               lambda g, v: super(_Keras3Mixin, self).apply(g, v))


class _Keras2Mixin(_DistributedOptimizerMixin):
    # ids of the gradients get_gradients/_compute_gradients returned reduced: the
    # apply_gradients given exactly those applies them as they are (both run at graph
    # construction, or both eagerly, in one Python call each).
    _hvd_reduced_ids: frozenset[int] = frozenset()

    def _hvd_reduced_for_apply(self, grads: list[Any], variables: list[Any]) -> list[Any]:
        reduced = self._hvd_reduce(grads, variables)
        self._hvd_reduced_ids = frozenset(id(g) for g in reduced if g is not None)
        return reduced

    def get_gradients(self, loss: Any, params: Sequence[Any]) -> list[Any]:
        """OptimizerV2's gradients for Keras 2's graph-mode get_updates: reduced."""
        grads = super().get_gradients(loss, params)  # type: ignore[misc]
        if self._hvd_passes > 1:
            raise ValueError("DistributedOptimizer: backward_passes_per_step > 1 needs "
                             "apply_gradients (model.fit or a custom loop), not "
                             "get_gradients/get_updates.")
        return self._hvd_reduced_for_apply(list(grads), list(params))

    def _compute_gradients(self, loss: Any, var_list: Any, grad_loss: Any = None,
                           tape: Any = None) -> list[tuple[Any, Any]]:
        """OptimizerV2's gradient step of ``minimize``, which Horovod's wrapper also gives
        Keras 2's newer optimizer: reduced, as Horovod's are (local variables' divided by
        the size when scale_local_gradients). With backward_passes_per_step > 1 they stay
        this rank's: apply_gradients sums and reduces them."""
        base = getattr(super(), "_compute_gradients", None)
        pairs = list(base(loss, var_list, grad_loss=grad_loss, tape=tape) if base is not None
                     else self.compute_gradients(loss, var_list, tape=tape))
        if self._hvd_passes > 1:
            return pairs
        variables = [v for _, v in pairs]
        return list(zip(self._hvd_reduced_for_apply([g for g, _ in pairs], variables),
                        variables))

    @property
    def _agg_helper(self) -> _Accumulation | None:
        """Horovod's name for the backward_passes_per_step state (its ``counter``)."""
        return self._hvd_accumulation

    def apply_gradients(self, grads_and_vars: Any, *args: Any, **kwargs: Any) -> Any:
        pairs = list(grads_and_vars)
        base = super(_Keras2Mixin, self).apply_gradients
        grads = [g for g, _ in pairs]
        reduced, self._hvd_reduced_ids = self._hvd_reduced_ids, frozenset()
        present = [id(g) for g in grads if g is not None]
        if present and all(i in reduced for i in present):
            return base(pairs, *args, **kwargs)

        def apply(grads: list[Any], variables: list[Any]) -> Any:
            return base(list(zip(grads, variables)), *args, **kwargs)
        return self._hvd_apply(grads, [v for _, v in pairs], apply)


def distributed_class(base: type) -> type:
    """The wrapped class: same name and module as base, so a saved model names base and
    loads without horovodish (load_model() below re-wraps it)."""
    base = getattr(base, "_hvd_base", base)
    if base not in _classes:
        mixin = _Keras2Mixin if KERAS_2 else _Keras3Mixin
        _classes[base] = type(base.__name__, (mixin, base),
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
                         device_sparse: str = "", compression: Compressor = Compression.none,
                         sparse_as_dense: bool = False, gradient_predivide_factor: float = 1.0,
                         op: ReduceOp = ReduceOp.AVERAGE, backward_passes_per_step: int = 1,
                         average_aggregated_gradients: bool = False, groups: Any = None,
                         process_set: ProcessSet = global_process_set,
                         num_groups: int = 0, scale_local_gradients: bool = True) -> Any:
    """A copy of a Keras optimizer (Keras 3's, or tf_keras' under TF_USE_LEGACY_KERAS=1)
    that averages (op) gradients across ranks.

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
    if KERAS_2 and mixed_float16():
        raise NotImplementedError(
            "DistributedOptimizer under tf_keras' mixed_float16 policy: its loss scaler "
            "checks each rank's own gradients, so ranks could skip different steps (and "
            "the reductions in them); use Keras 3 (unset TF_USE_LEGACY_KERAS) for mixed "
            "precision.")
    if (mixed_float16()
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
    if not isinstance(optimizer, optimizer_classes()):
        given = repr(optimizer) if isinstance(optimizer, str) else \
            f"the class {optimizer.__name__}" if isinstance(optimizer, type) else \
            f"a {type(optimizer).__name__}"
        other = other_keras_optimizer(optimizer)
        if other is not None:
            switch = "unset TF_USE_LEGACY_KERAS" if KERAS_2 else \
                "set TF_USE_LEGACY_KERAS=1 before importing TensorFlow"
            raise TypeError(f"DistributedOptimizer: {given} from {other}, but this process "
                            f"uses {NAME} (tf.keras); build the optimizer with tf.keras, "
                            f"or {switch}.")
        where = "tf.keras" if KERAS_2 else "keras"
        raise TypeError(f"DistributedOptimizer wraps a {NAME} optimizer instance "
                        f"({where}.optimizers.Optimizer), not {given}; pass e.g. "
                        f"{where}.optimizers.Adam(...) or {where}.optimizers.get('adam').")


def PartialDistributedOptimizer(optimizer: Any, name: str | None = None, device_dense: str = "",
                                device_sparse: str = "", compression: Compressor = Compression.none,
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

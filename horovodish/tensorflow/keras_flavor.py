"""The Keras that the adapter serves: Keras 3, or Keras 2 (``tf_keras``) when TensorFlow
is told to use it.

TensorFlow's answer for Keras 2 code is ``TF_USE_LEGACY_KERAS=1`` with ``tf_keras``
installed: ``tf.keras`` is then ``tf_keras``, and a Horovod script's optimizers, models
and callbacks are tf_keras objects, which Keras 3's classes do not accept. The choice is
TensorFlow's own rule, read once at import, so that ``hvd``'s classes and ``tf.keras``'s
always come from the same Keras. Everything that differs between the two (how an
optimizer is built, where its variables are, the mixed-precision policy) is answered
here, so the adapter's modules stay one copy for both.
"""
from __future__ import annotations

import importlib.util
import os
from typing import Any, Sequence

_TRUE = ("true", "True", "1")  # exactly TensorFlow's values


def legacy_keras_requested() -> bool:
    """TensorFlow's own test (its lazy loader of ``tf.keras``): TF_USE_LEGACY_KERAS is
    one of its true values and tf_keras is installed."""
    wanted = os.environ.get("TF_USE_LEGACY_KERAS") in _TRUE
    return wanted and importlib.util.find_spec("tf_keras") is not None


KERAS_2 = legacy_keras_requested()

if KERAS_2:
    import tf_keras as keras
else:
    import keras  # type: ignore[no-redef]

NAME = "tf_keras (Keras 2)" if KERAS_2 else "Keras 3"


def optimizer_classes() -> tuple[type, ...]:
    """The optimizer bases a DistributedOptimizer takes: Keras 2 has two (the optimizer of
    TF 2.11+ and ``tf_keras.optimizers.legacy``'s OptimizerV2)."""
    if KERAS_2:
        return (keras.optimizers.Optimizer, keras.optimizers.legacy.Optimizer)
    return (keras.optimizers.Optimizer,)


def is_legacy_optimizer(optimizer: Any) -> bool:
    """An OptimizerV2 (``tf_keras.optimizers.legacy``): slots, ``get_gradients``."""
    return KERAS_2 and isinstance(optimizer, keras.optimizers.legacy.Optimizer)


def other_keras_optimizer(optimizer: Any) -> str | None:
    """Names the other Keras when optimizer comes from it (a Keras 3 optimizer while
    TF_USE_LEGACY_KERAS=1, or the reverse), for the error that says which to use."""
    module = type(optimizer).__module__
    if KERAS_2 and module.startswith("keras."):
        return "Keras 3"
    if not KERAS_2 and module.startswith("tf_keras."):
        return "tf_keras (Keras 2)"
    return None


def optimizer_built(optimizer: Any) -> bool:
    if KERAS_2:
        if is_legacy_optimizer(optimizer):
            return bool(optimizer.weights) or bool(getattr(optimizer, "_slots", None))
        return bool(getattr(optimizer, "_built", False))
    return bool(optimizer.built)


def build_optimizer(optimizer: Any, variables: Sequence[Any]) -> None:
    """Create the optimizer's state for variables now (each Keras builds it in the first
    step otherwise), outside any function being traced."""
    if not KERAS_2:
        with keras.name_scope(optimizer.name, caller=optimizer):
            optimizer.build(list(variables))
        return
    import tensorflow as tf
    with tf.init_scope():
        if is_legacy_optimizer(optimizer):
            optimizer._create_all_weights(list(variables))
        else:
            optimizer.build(list(variables))


def optimizer_variables(optimizer: Any) -> list[Any]:
    """The optimizer's variables: a method in Keras 2's OptimizerV2, a property (a list
    that may also be called) elsewhere."""
    variables = optimizer.variables
    return list(variables() if callable(variables) else variables)


def mixed_float16() -> bool:
    """Whether the global dtype policy is mixed_float16."""
    if KERAS_2:
        return keras.mixed_precision.global_policy().name == "mixed_float16"
    return keras.config.dtype_policy().name == "mixed_float16"


def register_serializable(package: str) -> Any:
    """Keras' decorator that makes a class loadable by name."""
    if KERAS_2:
        return keras.utils.register_keras_serializable(package=package)
    return keras.saving.register_keras_serializable(package=package)

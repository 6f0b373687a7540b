"""``import horovodish.keras as hvd``: for scripts written against ``horovod.keras``.

Horovod kept one module for standalone Keras and one for ``tf.keras``; here both are the
Keras that ``tf.keras`` is (Keras 3, or tf_keras under TF_USE_LEGACY_KERAS=1: see
horovodish/tensorflow/keras_flavor.py), so both import lines give the same adapter,
``horovodish.tensorflow.keras``, and its submodules (``horovodish.keras.callbacks``,
``horovodish.keras.elastic``) are the same module objects.
"""
from __future__ import annotations

import sys

from ..tensorflow import keras as _adapter
from ..tensorflow.keras import *  # noqa: F401,F403  (the adapter's public names)
from ..tensorflow.keras import __all__  # noqa: F401

for _name in ("callbacks", "elastic"):
    if hasattr(_adapter, _name):
        globals()[_name] = getattr(_adapter, _name)
        sys.modules[f"{__name__}.{_name}"] = getattr(_adapter, _name)
del _name

"""Horovod import path (a shim): helpers Horovod scripts import from
``horovod.tensorflow.util``."""
from __future__ import annotations

import tensorflow as tf


def _executing_eagerly() -> bool:
    """True in eager mode, False while a ``tf.function`` or a v1 graph is being built."""
    return tf.executing_eagerly()

"""Gradient compression: cast before the allreduce, cast back after (Horovod's API)."""
from __future__ import annotations

from typing import Any

import tensorflow as tf


class Compressor:
    """Identity; subclasses change what travels on the wire."""

    @staticmethod
    def compress(tensor: tf.Tensor) -> tuple[tf.Tensor, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: tf.Tensor, ctx: Any) -> tf.Tensor:
        return tensor


class NoneCompressor(Compressor):
    """Send tensors as they are."""


class _CastCompressor(Compressor):
    wire_dtype: tf.DType = tf.float16

    @classmethod
    def compress(cls, tensor: tf.Tensor) -> tuple[tf.Tensor, Any]:
        if tensor.dtype.is_floating and tensor.dtype != cls.wire_dtype:
            return tf.cast(tensor, cls.wire_dtype), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor: tf.Tensor, ctx: Any) -> tf.Tensor:
        return tensor if ctx is None else tf.cast(tensor, ctx)


class FP16Compressor(_CastCompressor):
    """Halve the bytes on the wire; float16 keeps 11 bits of mantissa, 5 of exponent."""

    wire_dtype = tf.float16


class BF16Compressor(_CastCompressor):
    """Halve the bytes on the wire with float32's range (beyond Horovod)."""

    wire_dtype = tf.bfloat16


class Compression:
    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor

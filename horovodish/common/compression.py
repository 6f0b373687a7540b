"""Gradient compression, framework-neutral: what a ``compression=`` argument is, and the
cast that sends floating tensors as 16-bit ones (Horovod's ``Compression.fp16``; bf16 is
beyond Horovod). Each adapter's compressors are built on ``CastCompressor``, supplying
only its dtype test and its cast."""
from __future__ import annotations

from typing import Any, Protocol


class Compressor(Protocol):
    """What a ``compression=`` argument is (Horovod's contract): ``compress`` gives the
    tensor that goes on the wire and a context, ``decompress`` turns the reduced wire
    tensor back with that context. Horovod's compressors are passed as the class itself
    (``hvd.Compression.fp16``), their methods called on it: static or class methods."""

    def compress(self, tensor: Any) -> tuple[Any, Any]: ...

    def decompress(self, tensor: Any, ctx: Any) -> Any: ...


class Uncompressed:
    """Sends tensors as they are: the base of every adapter's compressors."""

    @staticmethod
    def compress(tensor: Any) -> tuple[Any, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        return tensor


class CastCompressor(Uncompressed):
    """A floating tensor of another dtype than ``wire_dtype`` travels cast to it and is
    cast back to its own dtype after the collective; others travel as they are. A
    subclass names ``wire_dtype`` and supplies its framework's ``is_floating`` and
    ``cast``."""

    wire_dtype: Any = None

    @staticmethod
    def is_floating(dtype: Any) -> bool:
        raise NotImplementedError

    @staticmethod
    def cast(tensor: Any, dtype: Any) -> Any:
        raise NotImplementedError

    @classmethod
    def compress(cls, tensor: Any) -> tuple[Any, Any]:
        dtype = tensor.dtype
        if cls.is_floating(dtype) and dtype != cls.wire_dtype:
            return cls.cast(tensor, cls.wire_dtype), dtype
        return tensor, None

    @classmethod
    def decompress(cls, tensor: Any, ctx: Any) -> Any:
        return tensor if ctx is None else cls.cast(tensor, ctx)

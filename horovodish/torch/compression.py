"""Gradient compression: cast before the allreduce, cast back after (Horovod's API)."""
from __future__ import annotations

from typing import Any

import torch


class Compressor:
    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor


class NoneCompressor(Compressor):
    """Send tensors as they are."""


class _CastCompressor(Compressor):
    wire_dtype: torch.dtype = torch.float16

    @classmethod
    def compress(cls, tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        if tensor.dtype.is_floating_point and tensor.dtype != cls.wire_dtype:
            return tensor.to(cls.wire_dtype), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor if ctx is None else tensor.to(ctx)


class FP16Compressor(_CastCompressor):
    """Halve the bytes on the wire; float16 keeps 11 bits of mantissa, 5 of exponent."""

    wire_dtype = torch.float16


class BF16Compressor(_CastCompressor):
    """Halve the bytes on the wire with float32's range (beyond Horovod)."""

    wire_dtype = torch.bfloat16


class Compression:
    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor

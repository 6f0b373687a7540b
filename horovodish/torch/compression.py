"""Gradient compression: cast before the allreduce, cast back after (Horovod's API; the
mechanism is common/compression.py's)."""
from __future__ import annotations

from typing import Any

import torch

from ..common.compression import CastCompressor, Uncompressed


class Compressor(Uncompressed):
    """Identity; subclasses change what travels on the wire."""


class NoneCompressor(Compressor):
    """Send tensors as they are."""


class _CastCompressor(CastCompressor, Compressor):
    wire_dtype: torch.dtype = torch.float16

    @staticmethod
    def is_floating(dtype: torch.dtype) -> bool:
        return dtype.is_floating_point

    @staticmethod
    def cast(tensor: torch.Tensor, dtype: Any) -> torch.Tensor:
        return tensor.to(dtype)


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

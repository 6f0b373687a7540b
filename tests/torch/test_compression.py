"""Horovod's Compression classes on torch tensors, in one process: class and call style
as Horovod's, floating tensors cast to 16 bits and back, others untouched."""
from __future__ import annotations

import torch

import horovodish.torch as hvd
from horovodish.torch.compression import (BF16Compressor, Compressor, FP16Compressor,
                                          NoneCompressor)


def test_horovod_s_classes_called_on_the_class():
    assert hvd.Compression.none is NoneCompressor
    assert hvd.Compression.fp16 is FP16Compressor and hvd.Compression.bf16 is BF16Compressor
    assert all(issubclass(c, Compressor) for c in (NoneCompressor, FP16Compressor,
                                                    BF16Compressor))
    x = torch.arange(3.0)
    assert NoneCompressor.compress(x) == (x, None) and NoneCompressor.decompress(x, None) is x


def test_floating_tensors_travel_in_16_bits_and_come_back_in_their_dtype():
    for compressor, wire in ((FP16Compressor, torch.float16), (BF16Compressor, torch.bfloat16)):
        for dtype in (torch.float32, torch.float64):
            x = torch.arange(4, dtype=dtype) / 4
            sent, ctx = compressor.compress(x)
            assert sent.dtype == wire and ctx == dtype
            back = compressor.decompress(sent, ctx)
            assert back.dtype == dtype and torch.equal(back, x)


def test_other_tensors_and_the_wire_dtype_travel_as_they_are():
    for compressor, wire in ((FP16Compressor, torch.float16), (BF16Compressor, torch.bfloat16)):
        for x in (torch.arange(4), torch.ones(2, dtype=torch.bool), torch.ones(2, dtype=wire)):
            sent, ctx = compressor.compress(x)
            assert sent is x and ctx is None
            assert compressor.decompress(sent, ctx) is sent

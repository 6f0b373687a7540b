"""The cast compressor every adapter's Compression.fp16/bf16 is built on, here on numpy."""
from __future__ import annotations

import numpy as np

from horovodish.common.compression import CastCompressor, Uncompressed


class NumpyFP16(CastCompressor):
    wire_dtype = np.dtype(np.float16)

    @staticmethod
    def is_floating(dtype: np.dtype) -> bool:
        return bool(np.issubdtype(dtype, np.floating))

    @staticmethod
    def cast(tensor: np.ndarray, dtype: np.dtype) -> np.ndarray:
        return tensor.astype(dtype)


def test_floating_tensors_travel_cast_and_come_back_in_their_dtype():
    x = np.arange(4, dtype=np.float64) / 3
    sent, ctx = NumpyFP16.compress(x)
    assert sent.dtype == np.float16 and ctx == np.float64
    back = NumpyFP16.decompress(sent, ctx)
    assert back.dtype == np.float64 and np.allclose(back, x, rtol=1e-3)


def test_other_tensors_and_the_wire_dtype_travel_as_they_are():
    for x in (np.arange(4, dtype=np.int64), np.ones(3, dtype=np.float16)):
        sent, ctx = NumpyFP16.compress(x)
        assert sent is x and ctx is None
        assert NumpyFP16.decompress(sent, ctx) is sent


def test_uncompressed_is_the_identity_called_on_the_class():
    x = np.ones(2)
    assert Uncompressed.compress(x) == (x, None)
    assert Uncompressed.decompress(x, None) is x

"""The batched pack/unpack kernel on a GPU (compiled by NVRTC through CuPy): ragged
shapes, every dtype, scale, zeros and skipped outputs, against CuPy's own arithmetic
on the same data. Skipped without a GPU (conftest.py); tests/common/test_gpu_fusion.py
runs the same kernel body on the host."""
from __future__ import annotations

import numpy as np
import pytest

from horovodish.common.execution.gpu_fusion import (
    BatchedCopier, CHUNK_ELEMENTS, INTEGER, pack_pointers, plan_layout, storage_dtype,
    unpack_pointers)

DTYPES = ["float16", "float32", "float64", "int8", "uint8", "int32", "int64", "bfloat16"]
COUNTS = (1, 0, CHUNK_ELEMENTS, 3 * CHUNK_ELEMENTS + 5, 17, 0, 2 * CHUNK_ELEMENTS - 1,
          1_000_003)


@pytest.mark.parametrize("dtype", DTYPES)
def test_pack_then_unpack_ragged(dtype):
    import cupy
    stream = cupy.cuda.Stream(non_blocking=True)
    copier = BatchedCopier(cupy)
    storage = storage_dtype(dtype)
    rng = np.random.default_rng(0)
    host = [rng.integers(-50, 50, c).astype(storage) if dtype in INTEGER or dtype == "bfloat16"
            else rng.standard_normal(c).astype(storage) for c in COUNTS]
    if dtype == "bfloat16":  # small integers' bit patterns: exact bfloat16 values
        host = [(np.abs(h) % 64 + 0x3F80).astype(np.int16) for h in host]
    tensors = [cupy.asarray(h) for h in host]
    layout = plan_layout(COUNTS)
    buffer = cupy.full(layout.total, 7, dtype=storage)
    inputs = [t.data.ptr if i != 4 else 0 for i, t in enumerate(tensors)]  # #4: zeros
    copier.launch(dtype, layout, *pack_pointers(layout, buffer.data.ptr, storage.itemsize,
                                                inputs), stream)
    outputs = [cupy.full(c, 3, dtype=storage) for c in COUNTS]
    targets = [o.data.ptr if i != 2 else 0 for i, o in enumerate(outputs)]  # #2: skipped
    copier.launch(dtype, layout, *unpack_pointers(layout, buffer.data.ptr, storage.itemsize,
                                                  targets), stream)
    stream.synchronize()  # (the test reads the result on the host)
    for i, (h, o) in enumerate(zip(host, outputs)):
        got = cupy.asnumpy(o)
        want = np.full_like(h, 3) if i == 2 else (np.zeros_like(h) if i == 4 else h)
        np.testing.assert_array_equal(got, want, err_msg=f"{dtype} tensor {i}")
    # A second launch of the same layout and pointers uploads no table.
    tables = len(copier._tables)
    copier.launch(dtype, layout, *pack_pointers(layout, buffer.data.ptr, storage.itemsize,
                                                inputs), stream)
    assert len(copier._tables) == tables


def test_scaling_on_the_gpu_matches_the_host_arithmetic():
    import cupy

    from horovodish.common.execution.arithmetic import scale_into
    stream = cupy.cuda.Stream(non_blocking=True)
    copier = BatchedCopier(cupy)
    values = np.random.default_rng(1).standard_normal(10_000).astype(np.float16)
    src = cupy.asarray(values)
    out = cupy.empty_like(src)
    copier.launch("float16", plan_layout((values.size,)), [src.data.ptr], [out.data.ptr],
                  stream, scale=0.37)
    stream.synchronize()
    want = np.empty_like(values)
    scale_into(want, values, 0.37)
    np.testing.assert_array_equal(cupy.asnumpy(out).view(np.uint16), want.view(np.uint16))

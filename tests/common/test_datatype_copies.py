"""Copying a fused buffer out to many outputs (one MPI datatype call, or a loop)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from horovodish.common.execution.datatype_copies import MIN_OUTPUTS, DatatypeCopier


def _layout(count: int, dtype) -> tuple[list, list[int], np.ndarray]:
    rng = np.random.default_rng(count)
    counts = [int(c) for c in rng.integers(0, 40, count)]
    buf = np.arange(sum(counts)).astype(dtype)
    outputs: list = []
    for i, c in enumerate(counts):
        if i % 7 == 3:
            outputs.append(None)  # not wanted (a rank that joined)
        elif i % 5 == 1 and c:
            outputs.append(np.zeros((c, 2), dtype)[:, 1])  # strided
        elif i % 4 == 2 and c % 2 == 0 and c:
            outputs.append(np.zeros((2, c // 2), dtype))  # 2-D
        else:
            outputs.append(np.zeros(c, dtype))
    return outputs, counts, buf


@pytest.mark.parametrize("count", [3, MIN_OUTPUTS, 200])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_, ml_dtypes.bfloat16])
def test_each_output_gets_its_slice(count, dtype):
    outputs, counts, buf = _layout(count, dtype)
    DatatypeCopier().copy_out(buf, outputs, counts)
    offset = 0
    for output, c in zip(outputs, counts):
        if output is not None:
            assert np.array_equal(output.reshape(-1), buf[offset:offset + c]), (offset, c)
        offset += c


def test_contiguous_outputs_take_the_single_call():
    """The datatype path (not the loop) handles a batch of contiguous outputs."""
    outputs = [np.zeros(8, np.float32) for _ in range(MIN_OUTPUTS)]
    buf = np.arange(8 * MIN_OUTPUTS, dtype=np.float32)
    copier = DatatypeCopier()
    assert copier._by_datatype(buf, outputs, [8] * MIN_OUTPUTS)
    assert np.array_equal(np.concatenate(outputs), buf)
    strided = [np.zeros((8, 2), np.float32)[:, 0]] + outputs[1:]
    assert not copier._by_datatype(buf, strided, [8] * MIN_OUTPUTS)  # the loop's job


def test_one_datatype_packs_and_copies_back():
    """describe() once, then gather (tensors -> flat) and copy (flat -> tensors): what the
    shared-memory backend does for in-place groups."""
    counts = [3, 0, 5, 8]
    arrays = [np.arange(c, dtype=np.float32) + 10 * i for i, c in enumerate(counts)]
    copier = DatatypeCopier()
    datatype = copier.describe(arrays, counts, np.dtype(np.float32))
    try:
        flat = np.zeros(sum(counts), np.float32)
        copier.pack(datatype, flat)
        assert np.array_equal(flat, np.concatenate(arrays))
        copier.unpack(flat * 2, datatype)
        assert all(np.array_equal(a, (np.arange(c) + 10 * i) * 2)
                   for i, (a, c) in enumerate(zip(arrays, counts)))
    finally:
        datatype.Free()
        copier.close()
    strided = arrays[:2] + [np.zeros(10, np.float32)[::2]] + arrays[3:]
    assert copier.describe(strided, counts, np.dtype(np.float32)) is None
    assert copier.describe(arrays, counts, np.dtype(np.float64)) is None


def test_read_only_outputs_are_not_written_behind_numpys_back():
    """MPI ignores numpy's writeable flag: read-only outputs take the loop, which
    raises as numpy does."""
    outputs = [np.zeros(4, np.float32) for _ in range(MIN_OUTPUTS)]
    outputs[3].flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        DatatypeCopier().copy_out(np.ones(4 * MIN_OUTPUTS, np.float32), outputs, [4] * MIN_OUTPUTS)
    assert not outputs[3].any()
    assert DatatypeCopier().describe(outputs, [4] * MIN_OUTPUTS, np.dtype(np.float32)) is None

"""TensorFlow's output buffers (horovodish/common/execution/buffers.py, as TensorFlow uses them), in one process: aligned
so that TensorFlow adopts them without a copy, reused once nothing holds them, and never
handed out again while a tensor made from them is alive."""
from __future__ import annotations

import gc

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from horovodish.tensorflow import ops  # noqa: E402
from horovodish.common.execution.buffers import ALIGN, OutputBlocks  # noqa: E402

F32 = np.dtype(np.float32)


def address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


def test_one_output_is_aligned_and_reused_once_dropped():
    blocks = OutputBlocks()
    first = blocks.one((250, 4), F32)
    where = address(first)
    assert where % ALIGN == 0 and first.shape == (250, 4) and first.dtype == F32
    held = blocks.one((250, 4), F32)
    assert address(held) != where, "a block still referenced was handed out again"
    del first
    again = blocks.one((1000,), F32)
    assert address(again) == where, "a dropped output's block was not reused"


def test_a_tensor_made_from_an_output_keeps_its_block():
    blocks = OutputBlocks()
    out = blocks.one((1000,), F32)
    out[:] = 7.0
    where = address(out)
    tensor = ops.to_tensor(out, aligned=True)
    assert address(np.asarray(tensor)) == where, "TensorFlow copied an aligned output"
    del out
    gc.collect()
    other = blocks.one((1000,), F32)
    assert address(other) != where, "handed out again while a tensor holds it"
    other[:] = -1.0
    np.testing.assert_array_equal(tensor.numpy(), np.full(1000, 7.0, np.float32))
    held = other  # now only the tensor's block is free to take
    del tensor, other
    gc.collect()
    assert address(blocks.one((1000,), F32)) == where, "not reused once the tensor died"
    del held


def test_a_group_is_carved_into_aligned_disjoint_outputs():
    blocks = OutputBlocks()
    shapes = [(3,), (5, 2), (0,), (), (17,)]
    dtypes = [np.dtype(d) for d in ("float64", "int8", "float32", "int32", "uint16")]
    outs = blocks.many(shapes, dtypes)
    for out, shape, dtype in zip(outs, shapes, dtypes):
        assert out.shape == shape and out.dtype == dtype and address(out) % ALIGN == 0
    for i, out in enumerate(outs):
        out.fill(i + 1)
    for i, out in enumerate(outs):  # nothing overlaps: each keeps its own value
        assert (out == i + 1).all(), f"output {i} was overwritten by another"
    where = [address(out) for out in outs]
    last = outs[-1]
    del outs
    second = blocks.many(shapes, dtypes)
    assert [address(o) for o in second] != where, \
        "a group's block was handed out again while one of its outputs is alive"
    del last, out  # the second group's block stays held: only the first one is free
    assert [address(o) for o in blocks.many(shapes, dtypes)] == where, \
        "a group's block was not reused once every output was dropped"

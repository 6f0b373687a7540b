"""Output buffers TensorFlow adopts without a copy, reused from call to call.

TensorFlow takes numpy memory through DLPack without a copy when it is aligned to 64
bytes (EIGEN_MAX_ALIGN_BYTES); the tensor then keeps the array alive until it dies. A
fresh buffer per call faults its pages in on every call (a 64 MiB allreduce spent about
6 ms of 23 on that here, and an eager call's allocation was 3 us of 44), so outputs are
carved from blocks that ``ResultBlocks`` hands out again once every tensor made from them
is gone: the DLPack capsule holds a view, and every view holds its block.
"""
from __future__ import annotations

import math
import threading
from typing import Sequence

import numpy as np

from ..common.execution.buffers import ALIGN, ResultBlocks, aligned_empty

_BYTES = np.dtype(np.uint8)


class OutputBlocks:
    """Aligned output arrays from reused blocks; safe to call from any thread (a graph's
    collectives run on TensorFlow's executor threads)."""

    def __init__(self) -> None:
        self._blocks = ResultBlocks(empty=aligned_empty)
        self._lock = threading.Lock()

    def one(self, shape: Sequence[int], dtype: np.dtype) -> np.ndarray:
        """An aligned output of shape and dtype."""
        with self._lock:
            block = self._blocks.take(dtype, math.prod(shape))
        return block.reshape(shape)

    def many(self, shapes: Sequence[Sequence[int]], dtypes: Sequence[np.dtype]
             ) -> list[np.ndarray]:
        """Aligned outputs for a group, carved from one block: per tensor a slice, not an
        allocation (a burst of 256 allocations was 3 ms)."""
        if len(shapes) == 1:
            return [self.one(shapes[0], dtypes[0])]
        places, total = [], 0
        for shape, dtype in zip(shapes, dtypes):
            nbytes = math.prod(shape) * dtype.itemsize
            places.append((total, total + nbytes))
            total += -(-nbytes // ALIGN) * ALIGN  # the next one starts aligned too
        with self._lock:
            block = self._blocks.take(_BYTES, total)
        return [block[start:stop].view(dtype).reshape(shape)
                for (start, stop), shape, dtype in zip(places, shapes, dtypes)]

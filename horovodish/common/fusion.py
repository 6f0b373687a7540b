"""Fusion: which ready responses share one collective, and the buffer they share.

Planning groups allreduce responses with the same op, dtype, device and scale factors,
in order of first appearance, up to the fusion threshold in bytes. Every rank plans from
the same response list, so every rank fuses identically.

Two kinds of buffer: the persistent fusion buffer (packed, reduced, copied out to the
callers' outputs), and result blocks, which callers that let the runtime own their
results (DistributedOptimizer's gradients) receive views of, saving the copy out.
"""
from __future__ import annotations

import sys

import numpy as np

from .messages import RequestType, Response


def plan_fusion(responses: list[Response], threshold: int) -> list[list[Response]]:
    groups: list[list[Response]] = []
    open_groups: dict[tuple, tuple[list[Response], int]] = {}
    for response in responses:
        if response.type != RequestType.ALLREDUCE or response.error is not None or threshold == 0:
            groups.append([response])
            continue
        key = response.fusion_key
        nbytes = response.nbytes
        current = open_groups.get(key)
        if current is not None and current[1] + nbytes <= threshold:
            current[0].append(response)
            open_groups[key] = (current[0], current[1] + nbytes)
        else:
            group = [response]
            groups.append(group)
            open_groups[key] = (group, nbytes)
    return groups


class FusionBuffers:
    """One persistent buffer per dtype, grown on demand, never allocated per cycle."""

    def __init__(self) -> None:
        self._buffers: dict[np.dtype, np.ndarray] = {}

    def get(self, dtype: np.dtype, count: int) -> np.ndarray:
        buf = self._buffers.get(dtype)
        if buf is None or buf.size < count:
            grown = max(count, 2 * buf.size if buf is not None else 0)
            buf = np.empty(grown, dtype=dtype)
            self._buffers[dtype] = buf
        return buf[:count]


class ResultBlocks:
    """Blocks whose views are handed out as results; a block is reused once no view of it
    is alive any more (numpy views keep their base alive, so its reference count says).

    In training the views become gradients that zero_grad() drops before the next
    backward, so each bucket keeps reusing one block: no allocation per step.
    """

    def __init__(self, keep: int = 64) -> None:
        self._keep = keep
        self._blocks: list[np.ndarray] = []

    def take(self, dtype: np.dtype, count: int) -> np.ndarray:
        """A flat block of at least count elements of dtype that nobody else references."""
        best = -1
        for i in range(len(self._blocks)):
            # References: the list and getrefcount's argument. Anything more is a view.
            if sys.getrefcount(self._blocks[i]) == 2 and self._blocks[i].dtype == dtype \
                    and self._blocks[i].size >= count \
                    and (best < 0 or self._blocks[i].size < self._blocks[best].size):
                best = i
        if best >= 0:
            return self._blocks[best][:count]
        block = np.empty(count, dtype=dtype)
        if len(self._blocks) >= self._keep:  # forget a free block, else keep it unpooled
            free = [i for i in range(len(self._blocks))
                    if sys.getrefcount(self._blocks[i]) == 2]
            if not free:
                return block
            del self._blocks[free[0]]
        self._blocks.append(block)
        return block

"""Fusion: which ready responses share one collective, and the buffer they share.

Planning groups allreduce responses with the same op, dtype, device and scale factors,
in order of first appearance, up to the fusion threshold in bytes. Every rank plans from
the same response list, so every rank fuses identically.

Two kinds of buffer: the persistent fusion buffer (packed, reduced, copied out to the
callers' outputs), and result blocks, which callers that let the runtime own their
results (DistributedOptimizer's gradients) receive views of, saving the copy out.
"""
from __future__ import annotations

import operator
import sys
from typing import Any, Callable

import numpy as np

from ..messages import RequestType, Response


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


class FusionPlanner:
    """plan_fusion, remembering the last plan: in steady state every cycle brings the
    same cached response objects in the same order, and re-planning hundreds of small
    tensors costs more than checking that nothing changed."""

    def __init__(self) -> None:
        self._responses: list[Response] = []
        self._threshold = -1
        self._groups: list[list[Response]] = []

    def plan(self, responses: list[Response], threshold: int) -> list[list[Response]]:
        if not (threshold == self._threshold and len(responses) == len(self._responses)
                and all(map(operator.is_, responses, self._responses))):
            self._groups = plan_fusion(responses, threshold)
            self._responses, self._threshold = responses, threshold
        return self._groups


def _host_empty(count: int, dtype: np.dtype) -> np.ndarray:
    return np.empty(count, dtype=dtype)


class FusionBuffers:
    """One persistent buffer per dtype, grown on demand, never allocated per cycle."""

    def __init__(self, empty: Callable[[int, np.dtype], Any] | None = None) -> None:
        """empty(count, dtype) allocates: host memory by default, or CuPy's device
        memory."""
        self._empty = empty or _host_empty
        self._buffers: dict[np.dtype, Any] = {}

    def get(self, dtype: np.dtype, count: int) -> np.ndarray:
        buf = self._buffers.get(dtype)
        if buf is None or buf.size < count:
            grown = max(count, 2 * buf.size if buf is not None else 0)
            buf = self._empty(grown, dtype)
            self._buffers[dtype] = buf
        return buf[:count]


class ResultBlocks:
    """Blocks whose views are handed out as results; a block is reused once no view of it
    is alive any more (numpy views keep their base alive, so its reference count says).

    In training the views become gradients that zero_grad() drops before the next
    backward, so each bucket keeps reusing one block: no allocation per step. A free
    block that no take has chosen for ``max_idle`` takes, or for about twice the number
    of blocks in use if that is more (the first step's per-gradient blocks, once learned
    buckets replace them), is released. A block serves requests of half its size or more
    only, and at most ``max_tracked`` blocks are tracked: beyond that the longest-held
    ones are left to their holders.
    """

    def __init__(self, max_idle: int = 64, max_tracked: int = 256,
                 empty: Callable[[int, np.dtype], Any] | None = None) -> None:
        """empty(count, dtype) allocates a block: host memory by default, or CuPy's
        device memory (whose views keep their base alive too)."""
        self._max_idle = max_idle
        self._max_tracked = max_tracked
        self._empty = empty or _host_empty
        self._blocks: list[Any] = []
        self._last_taken: list[int] = []
        self._takes = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def _free(self, i: int) -> bool:
        # References: the list and getrefcount's argument. Anything more is a view.
        return sys.getrefcount(self._blocks[i]) == 2

    def take(self, dtype: np.dtype, count: int) -> np.ndarray:
        """A flat block of at least count elements of dtype that nobody else references."""
        if count == 0:  # an empty view would keep a whole block alive
            return self._empty(0, dtype)
        self._takes += 1
        best = -1
        blocks = self._blocks
        for i in range(len(blocks)):  # no loop variable: it would hold a reference
            # At most twice the size: a small result must not pin a large block.
            if blocks[i].dtype == dtype and count <= blocks[i].size <= 2 * count and \
                    (best < 0 or blocks[i].size < blocks[best].size) and self._free(i):
                best = i
        if best < 0:
            self._blocks.append(self._empty(count, dtype))
            self._last_taken.append(0)
            best = len(self._blocks) - 1
        self._last_taken[best] = self._takes
        chosen = self._blocks[best]
        # Idle is measured in takes, and a step takes once per bucket: with many buckets
        # (or gradients kept across steps, which alternate two blocks per bucket) a block
        # in use every step sits out up to ~2 takes per block in use, so the limit grows
        # with those (not with all blocks: growing sizes would then never release any).
        in_use = sum(1 for i in range(len(self._blocks)) if not self._free(i))
        limit = max(self._max_idle, 2 * in_use + 2)
        stale = [i for i in range(len(self._blocks))
                 if self._takes - self._last_taken[i] > limit and self._free(i)]
        for i in reversed(stale):
            del self._blocks[i], self._last_taken[i]
        if len(self._blocks) > self._max_tracked:
            # Results the caller keeps (out-of-place allreduce results held in a list, say)
            # stay with the caller; tracking them all would make every take scan them.
            held = sorted((i for i in range(len(self._blocks)) if not self._free(i)),
                          key=self._last_taken.__getitem__)
            for i in sorted(held[:len(self._blocks) - self._max_tracked], reverse=True):
                del self._blocks[i], self._last_taken[i]
        return chosen[:count]

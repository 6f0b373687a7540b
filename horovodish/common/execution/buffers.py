"""The executor's memory: fusion buffers, result blocks, and aligned host allocation.

Two kinds of buffer: the persistent fusion buffer (packed, reduced, copied out to the
callers' outputs), and result blocks, which callers that let the runtime own their
results (DistributedOptimizer's gradients) receive views of, saving the copy out. Both
allocate host memory by default (``aligned_empty``), or CuPy's device memory where the
NCCL backend passes its allocator.
"""
from __future__ import annotations

import math
import sys
import threading
from typing import Any, Callable, Sequence

import numpy as np


# The blocks remembered per (dtype, count): results of one call kept in flight at once
# beyond this are found by a scan.
_RECENT_PER_SIZE = 32


# Host blocks start on this boundary: TensorFlow adopts memory without a copy only when
# it is aligned to EIGEN_MAX_ALIGN_BYTES (64), and a result that starts a block, or any
# one at a multiple of 64 bytes into it, can then become a TF tensor as it is.
ALIGN = 64
# Blocks of this size and more start on a huge-page boundary: a transparent huge page
# needs an aligned 2 MiB of the mapping, and malloc's 4 MiB mapping starts 16 bytes past
# a page, so half of it stayed in 4 KiB pages. MPI's transfers into such memory ran at
# half speed (the ring's receive scratch: docs/tuning.md, section 4).
HUGE_PAGE = 2 << 20


def aligned_empty(count: int, dtype: np.dtype) -> np.ndarray:
    """A flat array of count elements whose data starts on an ALIGN boundary (HUGE_PAGE
    from that size on), and whose views have it as their base. (A slice of an
    over-allocated array would not: numpy makes every view's base the array that owns
    the memory, so the reference count ResultBlocks reads would miss them. Over a
    memoryview, the array owns nothing and its base is no array, so numpy stops
    there.) numpy asks the kernel for huge pages on allocations of 4 MiB and more."""
    dtype = np.dtype(dtype)
    nbytes = count * dtype.itemsize
    align = HUGE_PAGE if nbytes >= HUGE_PAGE else ALIGN
    raw = np.empty(nbytes + align, np.uint8)
    start = -raw.ctypes.data % align
    if nbytes >= PREFAULT_BYTES:
        raw[start::_PAGE] = 0
    return np.frombuffer(memoryview(raw)[start:start + nbytes], dtype)


# Large blocks are written once a page as they are made. A first write from this
# process faults its pages in huge pages where the kernel has them; MPI receiving into
# fresh pages from another process (process_vm_writev) faults them 4 KiB at a time: an
# mpi4py Alltoall of 256 MiB into an untouched numpy buffer took 0.64 s, the same call
# into a written one 0.04 s (2 ranks, 2-core x86 VM). Blocks that are reused are the
# larger saving: a VM whose host reclaims freed memory makes every fresh page slow.
PREFAULT_BYTES = 1 << 20
_PAGE = 4096

_host_empty = aligned_empty


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
    buckets replace them), is released at the next sweep (every ``max_idle // 2`` takes,
    at most 16). A block serves requests of half its size or more only, and at most
    ``max_tracked`` blocks are tracked (checked at each sweep): beyond that the
    longest-held ones are left to their holders.
    """

    def __init__(self, max_idle: int = 64, max_tracked: int = 256,
                 empty: Callable[[int, np.dtype], Any] | None = None) -> None:
        """empty(count, dtype) allocates a block: host memory by default, or CuPy's device
        memory (whose views keep their base alive too)."""
        self._max_idle = max_idle
        self._max_tracked = max_tracked
        self._empty = empty or _host_empty
        self._blocks: list[Any] = []
        self._last_taken: list[int] = []
        self._takes = 0
        # The blocks chosen for each (dtype, count), in the order of their last take,
        # tried before a scan (_free_among).
        self._recent: dict[tuple[np.dtype, int], list[int]] = {}
        # Releasing idle blocks scans them all: done every few takes, not every take.
        self._sweep_every = max(1, min(max_idle // 2, 16))
        self._next_sweep = 0

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
        key = (dtype, count)
        recent = self._recent.get(key)
        if recent:  # a loop that drops its result: the newest block is free again
            newest = self._blocks[recent[-1]]
            # References: the list, this name and getrefcount's argument.
            if sys.getrefcount(newest) == 3 and self._takes < self._next_sweep:
                self._last_taken[recent[-1]] = self._takes
                return newest if newest.size == count else newest[:count]
            del newest
        best = -1
        if recent is not None:
            position = self._free_among(recent)
            if position >= 0:
                best = recent.pop(position)
        if best < 0:
            best = self._smallest_free(dtype, count)
            if best < 0:
                self._blocks.append(self._empty(count, dtype))
                self._last_taken.append(0)
                best = len(self._blocks) - 1
            if recent is None:
                if len(self._recent) > 4 * self._max_tracked:  # many sizes: start afresh
                    self._recent.clear()
                recent = self._recent[key] = []
            elif len(recent) >= _RECENT_PER_SIZE:
                del recent[0]
        recent.append(best)
        self._last_taken[best] = self._takes
        chosen = self._blocks[best]  # held here: in use, so no sweep releases it
        if self._takes >= self._next_sweep:
            self._release_idle()
            self._next_sweep = self._takes + self._sweep_every
        # The block itself where it fits exactly (a CuPy slice costs microseconds);
        # the caller's reference marks it busy just as a view's would.
        return chosen if chosen.size == count else chosen[:count]

    def _free_among(self, recent: list[int]) -> int:
        """The position in recent (take order) of a free block, -1 if none. The two
        newest first: a loop that drops its result reuses the newest, one that holds
        its last result alternates two, and the others go idle and are released. Then
        the rest, oldest first: a caller keeping k results of one call in flight
        (async calls synchronized later) frees them in the order taken, so the oldest
        is free again when tried: a few checks a take, not k."""
        n = len(recent)
        for position in range(n - 1, max(n - 3, -1), -1):
            if self._free(recent[position]):
                return position
        for position in range(n - 2):
            if self._free(recent[position]):
                return position
        return -1

    def _smallest_free(self, dtype: np.dtype, count: int) -> int:
        best = -1
        blocks = self._blocks
        for i in range(len(blocks)):  # no loop variable: it would hold a reference
            # At most twice the size: a small result must not pin a large block.
            if blocks[i].dtype == dtype and count <= blocks[i].size <= 2 * count and \
                    (best < 0 or blocks[i].size < blocks[best].size) and self._free(i):
                best = i
        return best

    def _release_idle(self) -> None:
        # Idle is measured in takes, and a step takes once per bucket: with many buckets
        # (or gradients kept across steps, which alternate two blocks per bucket) a block
        # in use every step sits out up to ~2 takes per block in use, so the limit grows
        # with those (not with all blocks: growing sizes would then never release any).
        in_use = sum(1 for i in range(len(self._blocks)) if not self._free(i))
        limit = max(self._max_idle, 2 * in_use + 2)
        doomed = [i for i in range(len(self._blocks))
                  if self._takes - self._last_taken[i] > limit and self._free(i)]
        if len(self._blocks) - len(doomed) > self._max_tracked:
            # Results the caller keeps (out-of-place allreduce results held in a list, say)
            # stay with the caller; tracking them all would make every take scan them.
            held = sorted((i for i in range(len(self._blocks)) if not self._free(i)),
                          key=self._last_taken.__getitem__)
            doomed += held[:len(self._blocks) - len(doomed) - self._max_tracked]
        if doomed:
            for i in sorted(set(doomed), reverse=True):
                del self._blocks[i], self._last_taken[i]
            self._recent.clear()  # indices moved


_BYTES = np.dtype(np.uint8)


class OutputBlocks:
    """Aligned output arrays from reused blocks, for adapters whose results adopt numpy
    memory (TensorFlow through DLPack, torch through from_numpy: the tensor keeps its
    view, and so the block, alive). Safe to call from any thread (a graph's collectives
    run on TensorFlow's executor threads; allocators run on the runtime thread)."""

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

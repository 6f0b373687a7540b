"""Bandwidth-optimal ring allreduce: reduce-scatter, then allgather, over MPI send/recv.

Each rank sends and receives 2(p-1)/p of the buffer, in chunks so the reduction of one
chunk runs while the next is in flight. On one host it beats MPICH's own allreduce for
large buffers (docs/tuning.md has the measured crossover); it also reduces float16 and
bfloat16, which MPI has no types for.
"""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ...dtypes import MPI_REDUCIBLE
from ...messages import ReduceOp, RequestType
from ..arithmetic import reduce_ufunc
from ..buffers import aligned_empty
from .base import Backend

_CHUNK_BYTES = 4 << 20
_REDUCING = (RequestType.ALLREDUCE, RequestType.REDUCESCATTER)


def _even_counts(total: int, parts: int) -> list[int]:
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


class RingBackend(Backend):
    name = "ring"

    def __init__(self, comm: MPI.Comm, threshold: int, mode: str | None) -> None:
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.threshold = threshold
        self.mode = mode
        self._scratch = np.empty(0, dtype=np.uint8)

    def enabled(self, kind: RequestType, dtype: str, nbytes: int, tensors: int = 1,
                op: ReduceOp | None = None) -> bool:
        if kind not in _REDUCING:
            return False
        if dtype not in MPI_REDUCIBLE or self.mode == "ring":
            return True
        return self.mode is None and nbytes >= self.threshold

    def allreduce(self, buf: np.ndarray, op: ReduceOp, source: np.ndarray | None = None
                  ) -> None:
        if self.size == 1:
            if source is not None:
                np.copyto(buf, source)
            return
        counts = _even_counts(buf.size, self.size)
        offsets = np.cumsum([0] + counts).tolist()
        self._reduce_scatter(buf, counts, offsets, op, source)
        self._allgather(buf, offsets)

    def reducescatter(self, send: np.ndarray, recv: np.ndarray, counts: list[int],
                      op: ReduceOp) -> None:
        if self.size == 1:
            np.copyto(recv.reshape(-1), send.reshape(-1))
            return
        # The ring of _reduce_scatter, keeping only what the next step sends: partial
        # sums alternate between two segment-sized buffers and the last lands in recv,
        # so scratch is 2/p of the buffer, not all of it (the sharded optimizer
        # reduce-scatters buckets of tens of MB). What arrives lands in the step's
        # target and takes this rank's part there.
        p, r = self.size, self.rank
        offsets = np.cumsum([0] + counts).tolist()
        longest = max(counts)
        ufunc = reduce_ufunc(send.dtype, op)
        source, out = send.reshape(-1), recv.reshape(-1)
        scratch = self._scratch_view(send.dtype, 2 * longest)
        partial = (scratch[:longest], scratch[longest:])
        left, right = (r - 1) % p, (r + 1) % p
        outgoing = source[offsets[(r - 1) % p]:offsets[(r - 1) % p + 1]]
        for step in range(p - 1):
            segment = (r - step - 2) % p  # what arrives from the left, and is summed
            own = source[offsets[segment]:offsets[segment + 1]]
            target = out if step == p - 2 else partial[step % 2][:own.size]
            for chunk in self._chunk_slices(longest, send.itemsize):
                self.comm.Sendrecv(_bytes(outgoing[chunk]), right,
                                   recvbuf=_bytes(target[chunk]), source=left)
                ufunc(own[chunk], target[chunk], out=target[chunk])
            outgoing = target

    def _reduce_scatter(self, buf: np.ndarray, counts: list[int], offsets: list[int],
                        op: ReduceOp, source: np.ndarray | None = None) -> None:
        """Afterwards segment `rank` of buf holds the reduction over all ranks. With a
        source, this rank's values are read from it: the first step sends a segment of
        source, and what arrives lands straight in buf's segment, which then takes
        source's part in place. No pass copies source into buf, nor goes through scratch
        (the segment that this rank only sends is written by the allgather that follows).
        In place, what arrives must wait in scratch: buf's segment still holds this
        rank's own values."""
        p, r = self.size, self.rank
        ufunc = reduce_ufunc(buf.dtype, op)
        tmp = self._scratch_view(buf.dtype, max(counts)) if source is None else None
        left, right = (r - 1) % p, (r + 1) % p
        mine = buf if source is None else source
        for step in range(p - 1):
            send_seg = (r - step - 1) % p
            recv_seg = (r - step - 2) % p
            send = (mine if step == 0 else buf)[offsets[send_seg]:offsets[send_seg + 1]]
            target = buf[offsets[recv_seg]:offsets[recv_seg + 1]]
            own = mine[offsets[recv_seg]:offsets[recv_seg + 1]]
            received = target if tmp is None else tmp[:target.size]
            for chunk in self._chunk_slices(max(counts), buf.itemsize):
                self.comm.Sendrecv(_bytes(send[chunk]), right,
                                   recvbuf=_bytes(received[chunk]), source=left)
                ufunc(own[chunk], received[chunk], out=target[chunk])

    def _allgather(self, buf: np.ndarray, offsets: list[int]) -> None:
        p, r = self.size, self.rank
        left, right = (r - 1) % p, (r + 1) % p
        longest = max(b - a for a, b in zip(offsets, offsets[1:]))
        for step in range(p - 1):
            send_seg = (r - step) % p
            recv_seg = (r - step - 1) % p
            send = buf[offsets[send_seg]:offsets[send_seg + 1]]
            recv = buf[offsets[recv_seg]:offsets[recv_seg + 1]]
            for chunk in self._chunk_slices(longest, buf.itemsize):
                self.comm.Sendrecv(_bytes(send[chunk]), right, recvbuf=_bytes(recv[chunk]),
                                   source=left)

    @staticmethod
    def _chunk_slices(longest: int, itemsize: int) -> list[slice]:
        """Chunks of a segment. Every rank iterates over the longest segment, so each
        Sendrecv meets its partner's even where segments differ in size (a slice past
        a shorter segment's end is empty)."""
        step = max(1, _CHUNK_BYTES // itemsize)
        return [slice(start, start + step) for start in range(0, max(longest, 1), step)]

    def _scratch_view(self, dtype: np.dtype, count: int, second: bool = False) -> np.ndarray:
        """A persistent scratch buffer: [receive area | work area], grown on demand."""
        half = count * dtype.itemsize
        need = 2 * half if second else half
        if self._scratch.nbytes < need:  # on huge pages: MPI receives into it
            self._scratch = aligned_empty(max(need, 2 * self._scratch.nbytes), np.uint8)
        start = half if second else 0
        return self._scratch[start:start + half].view(dtype)


def _bytes(array: np.ndarray) -> np.ndarray:
    return array.view(np.uint8)

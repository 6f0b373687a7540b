"""MPI's own collectives through mpi4py: the default for host memory.

Buffers are flat numpy arrays; counts are in elements of the array's dtype. Data that
MPI has no type for (float16, bfloat16) moves as bytes and never reduces here.

Allreduce goes in pieces of at most 2 MiB: MPICH's shared-memory allreduce slows down
per byte as messages grow (docs/tuning.md), and a piece stays in cache.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
from mpi4py import MPI

from ...dtypes import MPI_REDUCIBLE
from ...messages import ReduceOp, RequestType
from .base import Backend

_MPI_OPS = {ReduceOp.SUM: MPI.SUM, ReduceOp.MIN: MPI.MIN, ReduceOp.MAX: MPI.MAX,
            ReduceOp.PRODUCT: MPI.PROD}
_MPI_BOOL_OPS = {ReduceOp.SUM: MPI.LOR, ReduceOp.MAX: MPI.LOR, ReduceOp.MIN: MPI.LAND,
                 ReduceOp.PRODUCT: MPI.LAND}
_REDUCING = (RequestType.ALLREDUCE, RequestType.REDUCESCATTER)
ALLREDUCE_PIECE_BYTES = 2 << 20
_OVERLAP_BYTES = 1 << 20  # an out-of-place root copies on another thread from here
_COPIER: list[ThreadPoolExecutor] = []


def _copier() -> ThreadPoolExecutor:
    """One thread, made on first use, for the root's copy beside its broadcast."""
    if not _COPIER:
        _COPIER.append(ThreadPoolExecutor(1, thread_name_prefix="horovodish-bcast-copy"))
    return _COPIER[0]


def _mpi_op(dtype: np.dtype, op: ReduceOp) -> MPI.Op:
    return (_MPI_BOOL_OPS if dtype == np.bool_ else _MPI_OPS)[op]


def _as_bytes(buf: np.ndarray) -> np.ndarray:
    return buf.reshape(-1).view(np.uint8)


def _displacements(counts: list[int]) -> list[int]:
    displs, total = [], 0
    for count in counts:
        displs.append(total)
        total += count
    return displs


class MPIBackend(Backend):
    name = "mpi"

    def __init__(self, comm: MPI.Comm) -> None:
        self.comm = comm

    def enabled(self, kind: RequestType, dtype: str, nbytes: int, tensors: int = 1,
                op: ReduceOp | None = None) -> bool:
        return kind not in _REDUCING or dtype in MPI_REDUCIBLE

    def allreduce(self, buf: np.ndarray, op: ReduceOp, source: np.ndarray | None = None
                  ) -> None:
        mpi_op = _mpi_op(buf.dtype, op)
        step = max(1, ALLREDUCE_PIECE_BYTES // buf.itemsize)
        for start in range(0, buf.size, step):  # every rank cuts at the same offsets
            piece = slice(start, start + step)
            self.comm.Allreduce(MPI.IN_PLACE if source is None else source[piece], buf[piece],
                                op=mpi_op)

    def reducescatter(self, send: np.ndarray, recv: np.ndarray, counts: list[int],
                      op: ReduceOp) -> None:
        self.comm.Reduce_scatter(send, recv, recvcounts=counts, op=_mpi_op(send.dtype, op))

    def allgatherv(self, send: np.ndarray | None, recv: np.ndarray, counts: list[int]) -> None:
        item = recv.dtype.itemsize
        if counts.count(counts[0]) == len(counts):
            # Every rank sends as much: MPI_Allgather, whose algorithms MPICH tunes
            # (its Allgatherv took twice as long for 1 MiB on 2 ranks here).
            self.comm.Allgather(MPI.IN_PLACE if send is None else _as_bytes(send),
                                _as_bytes(recv))
            return
        byte_counts = [c * item for c in counts]
        self.comm.Allgatherv(MPI.IN_PLACE if send is None else _as_bytes(send),
                             [_as_bytes(recv), byte_counts, _displacements(byte_counts), MPI.BYTE])

    def bcast(self, buf: np.ndarray, root: int, root_out: np.ndarray | None = None) -> None:
        # MPI_Bcast, blocking on every rank: MPICH's Ibcast of large messages goes
        # through a scatter and an allgather (256 MiB on 2 ranks: 1.7x Bcast's time).
        # Out of place, the root copies buf into root_out on another thread while it
        # sends from buf (numpy and mpi4py both release the GIL): MPICH's large
        # transfers are read by the receiver from the root's memory, so they overlap.
        if root_out is None:
            self.comm.Bcast(_as_bytes(buf), root=root)
            return
        if buf.nbytes < _OVERLAP_BYTES:
            np.copyto(root_out, buf)
            self.comm.Bcast(_as_bytes(buf), root=root)
            return
        copy = _copier().submit(np.copyto, root_out, buf)
        try:
            self.comm.Bcast(_as_bytes(buf), root=root)
        finally:
            copy.result()

    def alltoallv(self, send: np.ndarray, send_counts: list[int], recv: np.ndarray,
                  recv_counts: list[int], uniform: bool = False) -> None:
        item = send.dtype.itemsize
        if uniform and send_counts:
            # MPI_Alltoall, whose pairwise exchange MPICH tunes: its Alltoallv of
            # 256 MiB on 2 ranks took 1.7x as long.
            self.comm.Alltoall(_as_bytes(send), _as_bytes(recv))
            return
        scounts = [c * item for c in send_counts]
        rcounts = [c * item for c in recv_counts]
        self.comm.Alltoallv([_as_bytes(send), scounts, _displacements(scounts), MPI.BYTE],
                            [_as_bytes(recv), rcounts, _displacements(rcounts), MPI.BYTE])

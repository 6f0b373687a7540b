"""MPI's own collectives through mpi4py: the default for host memory.

Buffers are flat numpy arrays; counts are in elements of the array's dtype. Data that
MPI has no type for (float16, bfloat16) moves as bytes and never reduces here.

Allreduce goes in pieces of at most 2 MiB: MPICH's shared-memory allreduce slows down
per byte as messages grow (docs/tuning.md), and a piece stays in cache.
"""
from __future__ import annotations

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
        # Out of place, the root sends from buf and copies it into root_out meanwhile:
        # MPICH's large transfers are read by the receiver from the root's memory (CMA),
        # so the copy overlaps them (16 MiB: 1.6-1.7 ms, against 2.9 with the copy after
        # and 1.8 in place). Every rank starts it nonblocking: a blocking broadcast
        # would not match the root's.
        request = self.comm.Ibcast(_as_bytes(buf), root=root)
        if root_out is not None:
            np.copyto(root_out, buf)
        request.Wait()

    def alltoallv(self, send: np.ndarray, send_counts: list[int], recv: np.ndarray,
                  recv_counts: list[int]) -> None:
        item = send.dtype.itemsize
        scounts = [c * item for c in send_counts]
        rcounts = [c * item for c in recv_counts]
        self.comm.Alltoallv([_as_bytes(send), scounts, _displacements(scounts), MPI.BYTE],
                            [_as_bytes(recv), rcounts, _displacements(rcounts), MPI.BYTE])

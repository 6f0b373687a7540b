"""Adasum: combine gradients so that parallel ones average and orthogonal ones add.

For two vectors, adasum(a, b) = (1 - a.b / 2|a|^2) a + (1 - a.b / 2|b|^2) b (a zero vector
contributes its partner unchanged). With 2^k ranks the ranks combine pairwise in k rounds
(partners at distance 1, 2, 4, ...); the formula is symmetric, so both partners compute
the same result and after the last round every rank holds the same vector. Applied per
tensor: a fused buffer is split back into its tensors for the dot products, so a group
goes in one piece (``pipelined = False``). Chosen by the op: first in the operation
manager's list, and enabled for Adasum allreduces only.
"""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ...messages import ReduceOp, RequestType
from .base import Backend


def is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def adasum_pair(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The two-vector Adasum, accumulated in float64."""
    a64, b64 = a.astype(np.float64, copy=False), b.astype(np.float64, copy=False)
    dot = float(np.dot(a64, b64))
    aa, bb = float(np.dot(a64, a64)), float(np.dot(b64, b64))
    ca = 1.0 - dot / (2 * aa) if aa > 0 else 1.0
    cb = 1.0 - dot / (2 * bb) if bb > 0 else 1.0
    return ca * a64 + cb * b64


class AdasumBackend(Backend):
    name = "adasum"
    pipelined = False

    def __init__(self, comm: MPI.Comm) -> None:
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()

    def enabled(self, kind: RequestType, dtype: str, nbytes: int, tensors: int = 1,
                op: ReduceOp | None = None) -> bool:
        return kind == RequestType.ALLREDUCE and op == ReduceOp.ADASUM

    def reduce_fused(self, buf: np.ndarray, counts: list[int], op: ReduceOp,
                     source: np.ndarray | None = None) -> None:
        """On buf, which holds len(counts) tensors back to back (source's, if given)."""
        if source is not None:
            np.copyto(buf, source)
        if not is_power_of_two(self.size):
            raise ValueError(f"Adasum needs a power-of-two number of ranks, not {self.size}")
        partner_buf = np.empty_like(buf)
        offsets = np.cumsum([0] + counts).tolist()
        distance = 1
        while distance < self.size:
            partner = self.rank ^ distance
            self.comm.Sendrecv(buf.view(np.uint8), partner, recvbuf=partner_buf.view(np.uint8),
                               source=partner)
            low, high = (buf, partner_buf) if self.rank < partner else (partner_buf, buf)
            for start, stop in zip(offsets, offsets[1:]):
                combined = adasum_pair(low[start:stop], high[start:stop])
                buf[start:stop] = combined.astype(buf.dtype, copy=False)
            distance *= 2

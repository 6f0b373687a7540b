"""What a backend is: a way to run collectives, and a rule for when it applies.

Allreduce has two entries: ``allreduce(buf, op)`` on one flat buffer, and
``allreduce_group(group)`` for a fused group, whose default packs the group into a
fusion buffer and reduces it with ``reduce_fused`` (fused_group.py). A backend with a
better way to run a group (shared memory) overrides ``allreduce_group``; one that needs
the tensors' boundaries (Adasum) overrides ``reduce_fused``.

A backend works on one kind of memory (``memory``): host backends get numpy buffers
from the executor, which does the local copies and scaling around their flat
primitives; a device-memory backend (NCCL) gets whole responses (``allreduce_group``,
``run_one``) and does those itself, on its own stream. The operation manager never
offers a request to a backend of the other memory.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from ...messages import ReduceOp, RequestType, Response
from ...entry import Entry
from ..fused_group import AllreduceGroup, through_fusion_buffer


class Backend(ABC):
    """One way to execute collectives. Runs on the runtime thread only."""

    name: str = "?"
    # Whether a large group may go in pieces of about 1 MiB (each piece reduced on its
    # own): False where a group's result depends on all of it at once (Adasum).
    pipelined: bool = True
    # "host" (numpy views) or "cuda" (CuPy views of device memory).
    memory: str = "host"

    @abstractmethod
    def enabled(self, kind: RequestType, dtype: str, nbytes: int, tensors: int = 1,
                op: ReduceOp | None = None) -> bool:
        """Whether this backend should run this collective on this data (nbytes in all,
        from this many tensors fused; op for reductions, Average arriving as Sum)."""

    def allreduce_group(self, group: AllreduceGroup) -> list:
        """Run a fused allreduce group; the result for each of its entries."""
        return through_fusion_buffer(self, group)

    def reduce_fused(self, buf: np.ndarray, counts: list[int], op: ReduceOp,
                     source: np.ndarray | None = None) -> None:
        """Reduce a buffer holding len(counts) tensors back to back: in place, or from
        source (this rank's values, the same size) into buf."""
        if buf.size:
            self.allreduce(buf, op, source)

    def allreduce(self, buf: np.ndarray, op: ReduceOp, source: np.ndarray | None = None
                  ) -> None:
        """Reduce flat buf in place, or source into buf: a backend reads source where
        it would first copy it, so an out-of-place call costs no extra pass."""
        raise NotImplementedError

    def reducescatter(self, send: np.ndarray, recv: np.ndarray, counts: list[int],
                      op: ReduceOp) -> None:
        raise NotImplementedError

    def allgatherv(self, send: np.ndarray | None, recv: np.ndarray, counts: list[int]) -> None:
        """send None: this rank's part is in recv already (in place)."""
        raise NotImplementedError

    def bcast(self, buf: np.ndarray, root: int, root_out: np.ndarray | None = None) -> None:
        """buf from root to every rank's buf; root_out (the root's only, out of place):
        the root leaves buf alone and gets the bytes in root_out."""
        raise NotImplementedError

    def alltoallv(self, send: np.ndarray, send_counts: list[int], recv: np.ndarray,
                  recv_counts: list[int], uniform: bool = False) -> None:
        """uniform: every rank sends every rank the same count (decided from the whole
        splits matrix, so every rank says the same)."""
        raise NotImplementedError

    def run_one(self, kind: RequestType, response: Response, entry: Entry | None,
                scaling: tuple[float, float, int]) -> Any:
        """Run an allgather, broadcast, alltoall or reducescatter whole and return what
        the executor's host path returns for it (device-memory backends only). scaling:
        (prescale, postscale, exact divisor or 0) as a reducescatter applies them."""
        raise NotImplementedError

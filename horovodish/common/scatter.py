"""Copying a fused buffer out to many outputs in one C call.

Unpacking 256 small tensors one np.copyto at a time costs ~1.4 us of Python per tensor,
about twice the copying itself when two ranks share the memory bus. An MPI datatype
that lists the outputs' absolute addresses lets MPI copy them all in one call: a
message from this process to itself, on a private copy of COMM_SELF (one per runtime
thread, so two threads' copies can never match each other's messages).
"""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

# Below this many outputs the per-output loop is as cheap as building a datatype.
MIN_OUTPUTS = 16


class Scatterer:
    """Copies consecutive slices of a 1-D buffer into outputs (C-contiguous arrays)."""

    def __init__(self) -> None:
        self._comm: MPI.Comm | None = None

    def close(self) -> None:
        if self._comm is not None:
            self._comm.Free()
            self._comm = None

    def copy_out(self, buf: np.ndarray, outputs: list[np.ndarray | None],
                 counts: list[int]) -> None:
        """outputs[i] (None: skipped) gets counts[i] elements of buf, in order."""
        if len(outputs) >= MIN_OUTPUTS and self._by_datatype(buf, outputs, counts):
            return
        offset = 0
        for output, count in zip(outputs, counts):
            if output is not None:
                np.copyto(output, buf[offset:offset + count].reshape(output.shape))
            offset += count

    def _by_datatype(self, buf: np.ndarray, outputs: list[np.ndarray | None],
                     counts: list[int]) -> bool:
        """One self-message from buf to the outputs; False when some output is not a
        C-contiguous array of buf's dtype and of exactly its count (then the caller
        loops, and np.copyto casts or raises as it should)."""
        itemsize = buf.itemsize
        lengths: list[int] = []
        addresses: list[int] = []
        source_offsets: list[int] = []
        offset = 0
        get_address = MPI.Get_address
        for output, count in zip(outputs, counts):
            if output is not None and count:
                if output.size != count or output.dtype != buf.dtype or \
                        not output.flags.c_contiguous:
                    return False
                lengths.append(count * itemsize)
                addresses.append(get_address(output))
                source_offsets.append(offset * itemsize)
            offset += count
        if not lengths:
            return True
        if self._comm is None:
            self._comm = MPI.COMM_SELF.Dup()
        target = MPI.BYTE.Create_hindexed(lengths, addresses).Commit()
        try:
            source: list = [buf.view(np.uint8), MPI.BYTE]
            if buf.nbytes != sum(lengths):  # some outputs skipped: a gapped source
                gapped = MPI.BYTE.Create_hindexed(lengths, source_offsets).Commit()
                source = [buf.view(np.uint8), 1, gapped]
            try:
                self._comm.Sendrecv(source, 0, 0, [MPI.BOTTOM, 1, target], 0, 0)
            finally:
                if len(source) == 3:
                    source[2].Free()
        finally:
            target.Free()
        return True

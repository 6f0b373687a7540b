"""Local copies between one flat buffer and many arrays, in one C call each.

Unpacking hundreds of small tensors one np.copyto at a time costs more Python per
tensor than the copying itself (docs/tuning.md). An MPI datatype
that lists the outputs' absolute addresses lets MPI copy them all in one call: a
message from this process to itself, on a private copy of COMM_SELF (one per runtime
thread, so two threads' copies can never match each other's messages).
"""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

# Below this many outputs the per-output loop is as cheap as building a datatype.
MIN_OUTPUTS = 16


class DatatypeCopier:
    """Copies between consecutive slices of a 1-D buffer and many C-contiguous arrays
    (no data leaves the process: MPI only does the copying)."""

    def __init__(self) -> None:
        self._comm: MPI.Comm | None = None

    def close(self) -> None:
        if self._comm is not None:
            self._comm.Free()
            self._comm = None

    def copy_out(self, buf: np.ndarray, outputs: list[np.ndarray | None],
                 counts: list[int], sized: bool = False) -> None:
        """outputs[i] (None: skipped) gets counts[i] elements of buf, in order. sized:
        the caller vouches that each output has its count of buf's dtype (the runtime's
        entries do: checked at submit), which saves checking it per output."""
        if len(outputs) >= MIN_OUTPUTS and self._by_datatype(buf, outputs, counts, sized):
            return
        offset = 0
        for output, count in zip(outputs, counts):
            if output is not None:
                np.copyto(output, buf[offset:offset + count].reshape(output.shape))
            offset += count

    def _by_datatype(self, buf: np.ndarray, outputs: list[np.ndarray | None],
                     counts: list[int], sized: bool = False) -> bool:
        """One self-message from buf to the outputs; False when some output is not a
        writeable C-contiguous array of buf's dtype and of exactly its count (then the
        caller loops, and np.copyto casts or raises as it should)."""
        layout = _layout(outputs, counts, buf.dtype, sized)
        if layout is None:
            return False
        lengths, addresses, source_offsets = layout
        if not lengths:
            return True
        target = MPI.BYTE.Create_hindexed(lengths, addresses).Commit()
        try:
            total = sum(lengths)
            if source_offsets is None or buf.nbytes == total:  # the outputs' bytes in a row
                self.unpack(buf.view(np.uint8)[:total], target)
            else:  # some outputs skipped: a gapped source
                gapped = MPI.BYTE.Create_hindexed(lengths, source_offsets).Commit()
                try:
                    self._self_message([buf.view(np.uint8), 1, gapped],
                                       [MPI.BOTTOM, 1, target])
                finally:
                    gapped.Free()
        finally:
            target.Free()
        return True

    def describe(self, arrays: list[np.ndarray], counts: list[int], dtype: np.dtype,
                 sized: bool = False) -> MPI.Datatype | None:
        """The arrays' memory (no None among them), in order, as one committed MPI
        datatype (the caller frees it), to copy from or to a flat buffer with ``pack``
        and ``unpack``; None when one is not a writeable C-contiguous array (nor, unless
        the caller vouches that it is, sized), of dtype and of exactly its count."""
        layout = _layout(arrays, counts, dtype, sized)
        if layout is None:
            return None
        return MPI.BYTE.Create_hindexed(layout[0], layout[1]).Commit()

    def pack(self, datatype: MPI.Datatype, buf: np.ndarray) -> None:
        """The memory datatype describes, concatenated into buf."""
        self._self_message([MPI.BOTTOM, 1, datatype], [buf.view(np.uint8), MPI.BYTE])

    def unpack(self, buf: np.ndarray, datatype: MPI.Datatype) -> None:
        """buf out to the memory datatype describes."""
        self._self_message([buf.view(np.uint8), MPI.BYTE], [MPI.BOTTOM, 1, datatype])

    def _self_message(self, source: list, target: list) -> None:
        if self._comm is None:
            self._comm = MPI.COMM_SELF.Dup()
        self._comm.Sendrecv(source, 0, 0, target, 0, 0)


def _layout(arrays: list[np.ndarray | None], counts: list[int], dtype: np.dtype,
            sized: bool = False) -> tuple[list[int], list[int], list[int] | None] | None:
    """(byte lengths, absolute addresses, byte offsets in the concatenation) of the
    non-empty arrays (None: skipped); offsets None when nothing is skipped (then they
    are the running sum of the lengths). None when an array is not a writeable, aligned
    C-contiguous array, or (unless sized) not of dtype and of exactly its count."""
    itemsize = dtype.itemsize
    gaps = False
    for array, count in zip(arrays, counts):
        if array is None or not count:
            gaps = True
            continue
        # carray: C-contiguous, aligned and writeable (MPI would write a read-only array
        # regardless) in one lookup. A 1 MiB piece of a burst has dozens of arrays,
        # and reading size and dtype costs per array: sized callers skip them.
        if not array.flags.carray or not sized and (
                array.size != count or array.dtype != dtype):
            return None
    if not gaps:  # the usual case: two C-level passes
        return [count * itemsize for count in counts], list(map(MPI.Get_address, arrays)), None
    lengths: list[int] = []
    addresses: list[int] = []
    offsets: list[int] = []
    offset = 0
    for array, count in zip(arrays, counts):
        if array is not None and count:
            lengths.append(count * itemsize)
            addresses.append(MPI.Get_address(array))
            offsets.append(offset * itemsize)
        offset += count
    return lengths, addresses, offsets

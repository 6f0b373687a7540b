"""Allreduce through memory shared by the ranks of one host.

Every rank owns a segment of an MPI shared-memory window (MPI_Win_allocate_shared) that
all ranks on the host can read. A fused allreduce then needs no messages at all:

  1. each rank packs its inputs straight into its own segment (the copy a fusion buffer
     needs anyway);
  2. barrier; each rank reduces one slice across all segments, writing into rank 0's;
  3. barrier; each rank copies the reduced data from rank 0's segment to its outputs
     (again the copy a fusion buffer needs anyway).

Against packing, MPI_Allreduce and unpacking, this skips MPI's own copies into and out of
its shared-memory cells. Large groups go in pieces that take parts of each segment in
turn: a rank packs into a part again only after the barrier of the piece before, which
every rank passes only once done with the piece that used it. The segments stay small
(a few MiB), and any dtype reduces (numpy does the arithmetic).

The barriers are counters in shared memory (shm_barrier.CounterBarrier):
about 1 us a meeting against MPICH's 2.3 us, and a 4 MiB allreduce meets eight times
(measured: 661 us against 736 us with MPI's barrier, in one job).

Only for communicators whose ranks all share one host, decided collectively at start,
and by default from 64 KiB on (single tensors up to the ring's threshold: see
``enabled``).
"""
from __future__ import annotations

import logging
from typing import Sequence

import numpy as np
from mpi4py import MPI

from ...messages import ReduceOp, RequestType
from ...shm_barrier import CounterBarrier
from ...peer_wait import Patience
from ..arithmetic import divide_toward_zero, reduce_ufunc, scale_into, scale_once
from ..datatype_copies import MIN_OUTPUTS, DatatypeCopier
from ..fused_group import AllreduceGroup, hand_out
from .base import Backend

log = logging.getLogger("horovodish")

# Bytes per piece (per rank, per half of its segment). Measured on 2 ranks: 1 MiB pieces
# keep pack, reduce and copy-out in cache (docs/tuning.md).
PIECE_BYTES = 1 << 20
# Parts of each rank's segment that pieces take in turn. Two are enough for safety; with
# four, a rank rarely writes a line another core has just read, which costs it dearly
# when the cores share no L3 (negotiation/shm_exchange.py): 4 MiB, 8 MiB and a burst of
# 256 x 16 KiB took 0.86-0.92x the time in one job each (docs/tuning.md).
TURNS = 4
# After each rank's parts: a flag that says its input could not be packed.
_FLAG_BYTES = 8
# Smaller allreduces go to MPI: two barriers cost more than MPI's own small-message path.
SHM_THRESHOLD = 64 << 10
# Only allreduce: collectives that only move bytes go to MPI, whose large transfers
# are a single copy (the reader reads the sender's memory, CMA), with no line written
# that the other core has just read. Through the segments, a broadcast ran 3 to 4 times
# slower than MPI's when the two cores do not share an L3 (16 MiB: 5.1-5.5 against
# 1.8 ms; 1 MiB: 350-420 against 95 us), and an allgather lost to MPI's too
# (docs/tuning.md, "Broadcast back to MPI").


class SharedMemoryBackend(Backend):
    name = "shm"

    def __init__(self, comm: MPI.Comm, mode: str | None, threshold: int = SHM_THRESHOLD,
                 piece_bytes: int = PIECE_BYTES, world_ranks: Sequence[int] | None = None,
                 single_below: int = 4 << 20, turns: int = TURNS,
                 patience: Patience | None = None) -> None:
        """single_below: single tensors from this size on are left to the ring (its
        threshold), fused groups are not (see ``enabled``). turns: parts of each
        segment that pieces take in turn (at least 2). patience: how long a barrier
        waits for a rank that never comes (peer_wait.py); None: for ever."""
        self.turns = turns
        self._patience = patience
        self.mode = mode
        self.threshold = threshold
        self.single_below = single_below
        self.piece_bytes = piece_bytes
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        # What messages call each rank: inside a process set, rank i is world_ranks[i].
        self._world_ranks = list(world_ranks) if world_ranks is not None else list(range(self.size))
        self._window: MPI.Win | None = None
        self._segments: list[np.ndarray] = []
        self._node: MPI.Comm | None = None
        self._copier = DatatypeCopier()
        self._failed: list[np.ndarray] = []  # per rank: "my input did not pack" flags
        self._pieces = 0  # pieces reduced so far; its parity picks the half to use
        # The pieces of recent groups by (counts, step): a training step repeats its
        # groups, and planning hundreds of tensors in Python is not free.
        self._plans: dict[tuple[tuple[int, ...], int], list] = {}
        if mode in (None, "shm") and self.size > 1:
            self._open(comm)

    @property
    def available(self) -> bool:
        return self._window is not None

    def _open(self, comm: MPI.Comm) -> None:
        """Collective over comm: every rank ends up with the window, or none does."""
        node = comm.Split_type(MPI.COMM_TYPE_SHARED)
        window, barrier, error = None, None, ""
        if node.Get_size() == self.size:
            try:
                window = MPI.Win.Allocate_shared(
                    self.turns * self.piece_bytes + _FLAG_BYTES, 1, comm=node)
                barrier = CounterBarrier(node, self._patience, names=self._world_ranks)
            except MPI.Exception as exc:
                error = str(exc)
        else:
            error = "the ranks span more than one host"
        if not comm.allreduce(barrier is not None, op=MPI.LAND):
            if barrier is not None:
                barrier.Free()
            if window is not None:
                window.Free()
            node.Free()
            if error and self.mode == "shm":
                log.warning("shared-memory allreduce unavailable (%s); using MPI", error)
            return
        self._segments, self._failed = [], []
        for rank in range(self.size):
            memory, _ = window.Shared_query(rank)
            whole = np.frombuffer(memory, dtype=np.uint8,
                                  count=self.turns * self.piece_bytes + _FLAG_BYTES)
            self._segments.append(whole[:self.turns * self.piece_bytes])
            self._failed.append(whole[self.turns * self.piece_bytes:].view(np.int64))
        window.Lock_all(MPI.MODE_NOCHECK)  # a passive epoch for Sync(): memory barriers
        self._window, self._node, self._barrier = window, node, barrier

    def close(self) -> None:
        if self._window is not None:
            self._window.Unlock_all()
            self._segments, self._failed = [], []
            self._window.Free()
            self._window = None
            self._barrier.Free()
            self._node.Free()
        self._copier.close()

    def enabled(self, kind: RequestType, dtype: str, nbytes: int, tensors: int = 1,
                op: ReduceOp | None = None) -> bool:
        """Fused groups from ``threshold`` bytes on: this saves a fusion buffer's pack and
        copy-out. Single tensors from ``threshold`` up to ``single_below``: they pay two
        copies here that MPI would not, and still came out ahead of MPI, on torch's
        memory most (MPI's transfers slow down on memory without huge pages; these
        copies do not). Larger single tensors go to the ring, which moves fewer bytes (MPI
        reads the other rank's memory once): from 4 MiB it took 0.4 to 0.9 of this
        path's time, and in some jobs this path ran 3x slower from 16 MiB on, for the
        whole job (figures: docs/tuning.md)."""
        if self._window is None or kind != RequestType.ALLREDUCE:
            return False
        return self.mode == "shm" or (self.mode is None and nbytes >= self.threshold and (
            tensors > 1 or nbytes < self.single_below))

    def allreduce_group(self, group: AllreduceGroup) -> list:
        """Inputs packed straight into shared memory, results copied straight out: no
        fusion buffer of our own. A caller that lets the runtime own its result (no
        output) makes the group reduce into a result block."""
        inputs: list[np.ndarray | None] = []
        outputs: list[np.ndarray | None] = []
        in_place, owned = True, False
        for entry in group.entries:
            if entry is None:
                inputs.append(None)
                outputs.append(None)
            else:
                tensor, output = entry.tensor, entry.output
                inputs.append(tensor)
                outputs.append(output)
                if output is not tensor:
                    in_place = False
                    owned = owned or output is None
        group.workspace.phase("SHM_ALLREDUCE")
        if owned:
            block = group.workspace.result_blocks.take(group.dtype, sum(group.counts))
            self.allreduce_into(inputs, group.counts, block, group.dtype, group.op,
                                group.prescale, group.postscale, group.divide_by)
            return hand_out(block, group.entries, group.responses)
        self.allreduce_into(inputs, group.counts, outputs, group.dtype, group.op,
                            group.prescale, group.postscale, group.divide_by, in_place)
        return outputs

    def reduce_slice(self, reduced: np.ndarray, op: ReduceOp) -> None:
        """Called with this rank's slice of each piece, reduced across the host, before
        it is scaled and shared: nothing more to do within one host; the hierarchical
        backend reduces it across hosts here."""

    def allreduce(self, buf: np.ndarray, op: ReduceOp, source: np.ndarray | None = None
                  ) -> None:
        flat = buf.reshape(-1)
        self.allreduce_into([flat if source is None else source.reshape(-1)], [flat.size],
                            [flat], flat.dtype, op)

    def allreduce_into(self, inputs: list[np.ndarray | None], counts: list[int],
                       outputs: list[np.ndarray | None] | np.ndarray, dtype: np.dtype,
                       op: ReduceOp, prescale: float = 1.0, postscale: float = 1.0,
                       divide_by: int = 0, in_place: bool = False) -> None:
        """Reduce the concatenation of inputs (None: zeros, for a rank that joined) into
        outputs: one array per input (None: not wanted), or one flat array for all.
        Arrays of dtype; outputs C-contiguous. Inputs are scaled by prescale, results by
        postscale, and integer results divided toward zero by divide_by when given.
        Every rank calls it with the same counts. ``in_place``: each output is its input
        (then one MPI datatype of the tensors' addresses serves to pack and to copy out).

        A copy that fails on this rank never skips a barrier (the ranks would fall out of
        step): the loop runs to the end and then raises. A failed pack is flagged in
        shared memory, so that every rank raises (its sum would be wrong); a failed copy
        out only affects this rank."""
        window, barrier = self._window, self._barrier.meet
        failure: Exception | None = None
        failed_ranks: set[int] = set()
        my_flag = self._failed[self.rank]
        itemsize = dtype.itemsize
        ufunc = reduce_ufunc(dtype, op)
        joined = any(source is None for source in inputs)
        block = outputs if isinstance(outputs, np.ndarray) else None
        copier = self._copier
        step = self.piece_bytes // itemsize
        key = (tuple(counts), step)
        pieces = self._plans.get(key)
        if pieces is None:
            if len(self._plans) >= 64:
                self._plans.clear()
            pieces = self._plans[key] = _plan(counts, step)
        for first, end, low, high, offset in pieces:
            count = high - low if low >= 0 else sum(counts[first:end])
            # Turns go on across calls too: a rank done with one call must not pack
            # into the part that a slower rank is still copying the last results from.
            self._pieces += 1
            part = (self._pieces % self.turns) * self.piece_bytes
            views = [segment[part:part + count * itemsize].view(dtype)
                     for segment in self._segments]
            mine = views[self.rank]
            tensors = None  # an MPI datatype of this piece's tensors, freed at its end
            # Many small tensors are packed as they are, then scaled in one pass.
            scale_after = prescale != 1.0 and low < 0 and not joined and \
                scale_once(count * itemsize, end - first)
            pack_scale = 1.0 if scale_after else prescale
            try:
                try:
                    # In place, a run of many whole tensors is described once for both
                    # copies: per tensor that saves as much Python as the copies cost.
                    if in_place and low < 0 and end - first >= MIN_OUTPUTS and \
                            pack_scale == 1.0 and block is None and not joined:
                        tensors = copier.describe(inputs[first:end], counts[first:end],
                                                     dtype, sized=True)
                    if tensors is not None:
                        copier.pack(tensors, mine)
                    elif low >= 0:  # part of one large tensor
                        _pack_part(mine, inputs[first], low, high, prescale)
                    elif pack_scale == 1.0 and not joined:
                        np.concatenate(inputs[first:end], axis=None, out=mine)  # flattens in C
                    else:
                        _pack_run(mine, inputs[first:end], counts[first:end], prescale)
                    if scale_after:
                        scale_into(mine, mine, prescale)
                    my_flag[0] = 0
                except Exception as exc:
                    failure = failure or exc
                    my_flag[0] = 1
                window.Sync()
                barrier()
                window.Sync()
                failed_ranks.update(rank for rank, flag in enumerate(self._failed) if flag[0])
                start = count * self.rank // self.size
                stop = count * (self.rank + 1) // self.size
                reduced = views[0][start:stop]
                for other in views[1:]:
                    ufunc(reduced, other[start:stop], out=reduced)
                self.reduce_slice(reduced, op)
                if divide_by:
                    divide_toward_zero(reduced, divide_by)
                if postscale != 1.0:
                    scale_into(reduced, reduced, postscale)
                window.Sync()
                barrier()
                window.Sync()
                result = views[0]
                try:
                    if tensors is not None:
                        copier.unpack(result, tensors)
                    elif block is not None:
                        np.copyto(block[offset:offset + count], result)
                    elif low >= 0:
                        _unpack_part(result, outputs[first], low, high)
                    else:
                        copier.copy_out(result, outputs[first:end], counts[first:end],
                                           sized=True)
                except Exception as exc:
                    failure = failure or exc
            finally:
                if tensors is not None:
                    tensors.Free()
        if failed_ranks - {self.rank}:
            ranks = ", ".join(str(self._world_ranks[rank]) for rank in sorted(failed_ranks))
            raise RuntimeError(f"rank {ranks} could not copy its input into shared memory"
                               + (f" ({failure})" if failure else ""))
        if failure is not None:
            raise failure


def _plan(counts: list[int], step: int) -> list[tuple[int, int, int, int, int]]:
    """Pieces of at most step elements, as (first, end, low, high, offset): the whole
    tensors first..end-1 (low = high = -1), or elements [low, high) of tensor first
    alone (one larger than a piece). offset: where the piece starts in the
    concatenation. Every rank plans the same pieces from the same counts."""
    pieces = []
    first, run, offset = 0, 0, 0
    for index, count in enumerate(counts):
        if count > step:
            if index > first:
                pieces.append((first, index, -1, -1, offset - run))
            for low in range(0, count, step):
                pieces.append((index, index + 1, low, min(low + step, count), offset + low))
            first, run = index + 1, 0
        elif run + count > step:
            pieces.append((first, index, -1, -1, offset - run))
            first, run = index, count
        else:
            run += count
        offset += count
    if len(counts) > first and run:
        pieces.append((first, len(counts), -1, -1, offset - run))
    return pieces


def _pack_run(target: np.ndarray, inputs: list[np.ndarray | None], counts: list[int],
              prescale: float) -> None:
    """Whole tensors one by one: scaled, or zeros for a rank that joined."""
    offset = 0
    for source, count in zip(inputs, counts):
        part = target[offset:offset + count]
        if source is None:
            part.fill(0)
        elif prescale == 1.0:
            np.copyto(part, source.reshape(-1))
        else:
            scale_into(part, source.reshape(-1), prescale)
        offset += count


def _pack_part(target: np.ndarray, source: np.ndarray | None, low: int, high: int,
               prescale: float) -> None:
    if source is None:
        target.fill(0)
        return
    # A strided source has no flat view: .flat copies just this part, not all of it.
    part = source.reshape(-1)[low:high] if source.flags.c_contiguous else source.flat[low:high]
    if prescale == 1.0:
        np.copyto(target, part)
    else:
        scale_into(target, part, prescale)


def _unpack_part(result: np.ndarray, output: np.ndarray | None, low: int, high: int) -> None:
    if output is None:
        return
    if output.flags.c_contiguous:
        np.copyto(output.reshape(-1)[low:high], result)
    else:  # a strided output has no flat view to write through
        output.flat[low:high] = result

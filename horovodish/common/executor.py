"""Executes planned responses on this rank's entries and completes their handles.

Allreduce: copy in (prescaled) to the fusion buffer, reduce, copy out (postscaled).
Average is Sum with a 1/size factor for floating types (float32/float64 apply it on the
way in, float16/bfloat16 on the way out); for integers a division toward zero, or with a
postscale a factor postscale/size, truncated (Horovod's results). A rank that
has joined has no entry and contributes zeros.

Entries without an output (callers that let the runtime own the result) are packed into
a result block instead and get views of it: no copy out.
"""
from __future__ import annotations

import numpy as np

from .backends.adasum import Adasum
from .backends.base import divide_toward_zero
from .backends.shm import SharedMemoryBackend
from .dtypes import FLOATING, numpy_dtype
from .entry import Entry, finish_all
from .errors import HorovodInternalError, RankMismatchError
from .fusion import FusionBuffers, ResultBlocks
from .messages import ReduceOp, RequestType, Response
from .operations import OperationManager
from .scatter import MIN_OUTPUTS, Scatterer
from .timeline import Timeline, now_us


class _CopyFailed(Exception):
    """A local copy into or out of the fusion buffer failed; the collective still ran."""


# Pack / reduce / copy out a large group in pieces of about this size (see _pieces).
PIPELINE_PIECE_BYTES = 1 << 20


def _reduction_counts(rows: int, size: int) -> list[int]:
    """Rows of a reducescatter per rank: the first rows % size ranks get one more."""
    base, extra = divmod(rows, size)
    return [base + (1 if r < extra else 0) for r in range(size)]


class Executor:
    def __init__(self, operations: OperationManager, rank: int, size: int,
                 adasum: Adasum | None = None) -> None:
        self.operations = operations
        self.adasum = adasum
        self.rank = rank
        self.size = size
        self.buffers = FusionBuffers()
        self.result_blocks = ResultBlocks()
        self.scatterer = Scatterer()
        self.timeline: Timeline | None = None  # set by the runtime while recording
        self._marks: list[tuple[str, float]] = []

    def execute(self, group: list[Response], mine: list[Entry | None],
                ready_at_us: float = 0.0) -> None:
        """Run one planned group (mine: this rank's entry for each response, None where
        it has none); failures go to the group's handles, not the caller."""
        first = group[0]
        if first.error is not None:
            _fail(mine, RankMismatchError(first.error))
            return
        timeline = self.timeline
        if timeline is not None:
            self._marks = [("QUEUE", ready_at_us)]
        try:
            results = self._run(first.type, group, mine)
        except Exception as exc:  # a backend failure fails the tensors, not the thread
            _fail(mine, HorovodInternalError(
                f"{first.type.opname} of {', '.join(repr(r.name) for r in group)} failed: {exc}"))
            return
        finally:
            if timeline is not None:
                timeline.group([r.name for r in group], first.type.name, self._marks, now_us())
        finish_all(mine, results)

    def _run(self, kind: RequestType, group: list[Response], mine: list[Entry | None]) -> list:
        if kind == RequestType.ALLREDUCE:
            return self._allreduce(group, mine)
        response, entry = group[0], mine[0]
        if kind == RequestType.ALLGATHER:
            return [self._allgather(response, entry)]
        if kind == RequestType.BROADCAST:
            return [self._broadcast(response, entry)]
        if kind == RequestType.ALLTOALL:
            return [self._alltoall(response, entry)]
        if kind == RequestType.REDUCESCATTER:
            return [self._reducescatter(response, entry)]
        if kind == RequestType.JOIN:
            return [response.last_joined]
        return [None]  # barrier: negotiation itself waited for every rank

    def _backend(self, kind: RequestType, response: Response, nbytes: int, tensors: int = 1):
        return self.operations.choose(kind, response.dtype, nbytes, tensors)

    def _phase(self, phase: str) -> None:
        """Mark the start of a timeline phase; it lasts until the next mark."""
        if self.timeline is not None:
            self._marks.append((phase, now_us()))

    # -- allreduce -------------------------------------------------------------------
    def _allreduce(self, group: list[Response], mine: list[Entry | None]) -> list:
        first = group[0]
        dtype = numpy_dtype(first.dtype)
        counts = [r.count for r in group]
        total = sum(counts)
        op = ReduceOp.SUM if first.reduce_op == ReduceOp.AVERAGE else first.reduce_op
        backend = self._backend(RequestType.ALLREDUCE, first, total * dtype.itemsize,
                                len(group))
        pre, post = self._scales(first)
        if isinstance(backend, SharedMemoryBackend) and op != ReduceOp.ADASUM:
            return self._allreduce_shared(backend, first, group, mine, counts, dtype, op,
                                          pre, post)
        # Some caller lets the runtime own its result: reduce in a result block.
        owned = any(entry is not None and entry.output is None for entry in mine)
        # The collectives must be the same on every rank, so pieces follow from the group
        # alone, never from rank-local facts (whether this rank owns results, has joined).
        pieces = [(0, len(group))] if op == ReduceOp.ADASUM else \
            self._pieces(counts, dtype.itemsize, backend, first)
        # One tensor reduces in its output, if that has a flat view.
        single = not owned and len(group) == 1 and mine[0] is not None and \
            mine[0].output.flags.c_contiguous
        if not (single or owned):
            failure = None
            for start, end in pieces:  # a failed copy must not skip a later collective
                try:
                    self._through_fusion_buffer(first, mine[start:end], counts[start:end],
                                                dtype, op, backend, pre, post)
                except _CopyFailed as exc:
                    failure = failure or exc.__cause__
            if failure is not None:
                raise failure
            return [entry.output if entry is not None else None for entry in mine]
        if owned:
            buf = self.result_blocks.take(dtype, total)
        else:
            buf = mine[0].output.reshape(-1)
        self._phase("MEMCPY_IN_FUSION_BUFFER")
        if single:  # one tensor: one piece
            _scaled_copy(buf, mine[0].tensor.reshape(-1), pre)
            self._reduce(first, buf, counts, op, backend)
        else:  # in the same pieces, though the result block is contiguous
            offset, failure = 0, None
            for start, end in pieces:
                size = sum(counts[start:end])
                part = buf[offset:offset + size]
                try:
                    self._pack(part, mine[start:end], counts[start:end], dtype, pre)
                except Exception as exc:  # never skip a collective the others will run
                    failure = failure or exc
                    part.fill(0)
                self._reduce(first, part, counts[start:end], op, backend)
                offset += size
            if failure is not None:
                raise failure
        if post != 1.0:  # reduced where the caller reads it
            np.multiply(buf, post, out=buf, casting="unsafe")
        if single:
            return [mine[0].output]
        return _hand_out(buf, mine, group)

    def _allreduce_shared(self, backend: SharedMemoryBackend, first: Response,
                          group: list[Response], mine: list[Entry | None], counts: list[int],
                          dtype: np.dtype, op: ReduceOp, pre: float, post: float) -> list:
        """Inputs packed straight into shared memory, results copied straight out: no
        fusion buffer of our own. A caller that lets the runtime own its result (no
        output) makes the group reduce into a result block."""
        inputs: list[np.ndarray | None] = []
        outputs: list[np.ndarray | None] = []
        in_place, owned = True, False
        for entry in mine:
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
        divide_by = self.size if self._divides(first) else 0
        self._phase("SHM_ALLREDUCE")
        if owned:
            block = self.result_blocks.take(dtype, sum(counts))
            backend.allreduce_into(inputs, counts, block, dtype, op, pre, post, divide_by)
            return _hand_out(block, mine, group)
        backend.allreduce_into(inputs, counts, outputs, dtype, op, pre, post, divide_by,
                               in_place)
        return outputs

    def close(self) -> None:
        """Release what the backends hold (collective: every rank's runtime calls it
        after the same negotiated shutdown)."""
        for backend in self.operations.backends:
            close = getattr(backend, "close", None)
            if close is not None:
                close()
        self.scatterer.close()

    def _through_fusion_buffer(self, first: Response, mine: list[Entry | None],
                               counts: list[int], dtype: np.dtype, op: ReduceOp, backend,
                               pre: float, post: float) -> None:
        """Pack, reduce and copy out to the callers' outputs."""
        buf = self.buffers.get(dtype, sum(counts))
        self._phase("MEMCPY_IN_FUSION_BUFFER")
        try:
            self._pack(buf, mine, counts, dtype, pre)
        except Exception as exc:
            buf.fill(0)  # still take part in the collective, contributing nothing
            self._reduce(first, buf, counts, op, backend)
            raise _CopyFailed() from exc
        self._reduce(first, buf, counts, op, backend)
        try:
            self._unpack(buf, mine, counts, post)
        except Exception as exc:
            raise _CopyFailed() from exc

    def _reduce(self, first: Response, buf: np.ndarray, counts: list[int], op: ReduceOp,
                backend) -> None:
        if op == ReduceOp.ADASUM:
            self._phase("ADASUM_ALLREDUCE")
            self.adasum.allreduce(buf, counts)
        else:
            self._phase(f"{backend.name.upper()}_ALLREDUCE")
            if buf.size:
                backend.allreduce(buf, op)
        self._phase("MEMCPY_OUT_FUSION_BUFFER")
        if self._divides(first):
            divide_toward_zero(buf, self.size)

    def _pieces(self, counts: list[int], itemsize: int, backend, first: Response
                ) -> list[tuple[int, int]]:
        """Consecutive runs of a group's tensors, each about PIPELINE_PIECE_BYTES, to pack,
        reduce and copy out one after the other: a 1 MiB fusion buffer stays in cache
        where a 4 MiB one does not (256 x 16 KiB, 2 ranks: 1.5-1.9 ms against 2.0-2.3 ms).
        One run when pieces would change the backend the group's size chose (the ring
        is faster for large buffers). Every rank cuts at the same tensors."""
        if len(counts) < 2 or sum(counts) * itemsize < 2 * PIPELINE_PIECE_BYTES or \
                self._backend(RequestType.ALLREDUCE, first, PIPELINE_PIECE_BYTES,
                              len(counts)) is not backend:
            return [(0, len(counts))]
        pieces, start, piece_bytes = [], 0, 0
        for index, count in enumerate(counts):
            piece_bytes += count * itemsize
            if piece_bytes >= PIPELINE_PIECE_BYTES:
                pieces.append((start, index + 1))
                start, piece_bytes = index + 1, 0
        if start < len(counts):
            pieces.append((start, len(counts)))
        return pieces

    def _unpack(self, buf: np.ndarray, mine: list[Entry | None], counts: list[int],
                post: float) -> None:
        """The fusion buffer out to the callers' outputs, scaled by post: a few tensors
        scale on the way out (one pass), many are copied out in one C call."""
        if len(mine) < MIN_OUTPUTS:
            offset = 0
            for entry, count in zip(mine, counts):
                if entry is not None:
                    output = entry.output
                    _scaled_copy(output, buf[offset:offset + count].reshape(output.shape),
                                 post)
                offset += count
            return
        if post != 1.0:
            np.multiply(buf, post, out=buf, casting="unsafe")
        self.scatterer.copy_out(buf, [e.output if e is not None else None for e in mine],
                                counts, sized=True)

    def _scales(self, first: Response, divide_first: bool = True) -> tuple[float, float]:
        """(prescale, postscale) as applied; Average's 1/size joins one of them, except
        for integers without a postscale (see _divides)."""
        pre, post = first.prescale, first.postscale
        if first.reduce_op == ReduceOp.AVERAGE and divide_first and \
                first.dtype in _DIVIDE_FIRST:
            pre = pre / self.size  # on the way in: saves the in-place pass over results
        elif first.reduce_op == ReduceOp.AVERAGE and not self._divides(first):
            # Integers with a postscale: trunc(sum * postscale / size), as Horovod.
            post = post / self.size
        return pre, post

    @staticmethod
    def _divides(first: Response) -> bool:
        """Integer Average without a postscale: an exact division toward zero."""
        return first.reduce_op == ReduceOp.AVERAGE and first.dtype not in FLOATING and \
            first.postscale == 1.0

    def _pack(self, buf: np.ndarray, mine: list[Entry | None], counts: list[int],
              dtype: np.dtype, prescale: float) -> None:
        """All inputs into the fusion buffer: one C call, or one scaled copy per tensor
        (zeros for a joined rank)."""
        if prescale == 1.0:
            parts = [entry.tensor if entry is not None else np.zeros(count, dtype)
                     for entry, count in zip(mine, counts)]
            np.concatenate(parts, axis=None, out=buf)  # flattens in C
            return
        offset = 0
        for entry, count in zip(mine, counts):
            target = buf[offset:offset + count]
            if entry is None:
                target.fill(0)
            else:
                np.multiply(entry.tensor.reshape(-1), prescale, out=target, casting="unsafe")
            offset += count

    # -- the rest ---------------------------------------------------------------------
    def _allgather(self, response: Response, entry: Entry) -> np.ndarray:
        first_dims = response.first_dims
        assert first_dims is not None
        row_shape = response.shape[1:]
        out = entry.allocate((sum(first_dims),) + tuple(row_shape))
        row = int(np.prod(row_shape, dtype=np.int64))
        counts = [d * row for d in first_dims]
        backend = self._backend(RequestType.ALLGATHER, response, sum(counts) * out.itemsize)
        self._phase(f"{backend.name.upper()}_ALLGATHER")
        if out.size:
            backend.allgatherv(entry.tensor.reshape(-1), out.reshape(-1), counts)
        return out

    def _broadcast(self, response: Response, entry: Entry) -> np.ndarray:
        out = entry.output
        if self.rank == response.root_rank and out is not entry.tensor:
            np.copyto(out, entry.tensor)
        backend = self._backend(RequestType.BROADCAST, response, out.nbytes)
        self._phase(f"{backend.name.upper()}_BROADCAST")
        if out.size:
            backend.bcast(out.reshape(-1), response.root_rank)
        return out

    def _alltoall(self, response: Response, entry: Entry) -> tuple[np.ndarray, np.ndarray]:
        splits = response.splits
        assert splits is not None
        row_shape = tuple(entry.tensor.shape[1:])
        row = int(np.prod(row_shape, dtype=np.int64))
        received = [splits[src][self.rank] for src in range(self.size)]
        out = entry.allocate((sum(received),) + row_shape)
        backend = self._backend(RequestType.ALLTOALL, response, entry.tensor.nbytes)
        self._phase(f"{backend.name.upper()}_ALLTOALL")
        backend.alltoallv(entry.tensor.reshape(-1), [s * row for s in splits[self.rank]],
                          out.reshape(-1), [s * row for s in received])
        return out, np.asarray(received, dtype=np.int32)

    def _reducescatter(self, response: Response, entry: Entry) -> np.ndarray:
        rows = response.shape[0] if response.shape else 0
        row = int(np.prod(response.shape[1:], dtype=np.int64))
        counts = [c * row for c in _reduction_counts(rows, self.size)]
        out = entry.output
        dtype = numpy_dtype(response.dtype)
        send = self.buffers.get(dtype, sum(counts))
        _scaled_copy(send, entry.tensor.reshape(-1), response.prescale)
        op = ReduceOp.SUM if response.reduce_op == ReduceOp.AVERAGE else response.reduce_op
        backend = self._backend(RequestType.REDUCESCATTER, response, send.nbytes)
        flat_out = out.reshape(-1)
        self._phase(f"{backend.name.upper()}_REDUCESCATTER")
        if send.size:
            backend.reducescatter(send, flat_out, counts, op)
        _, post = self._scales(response, divide_first=False)
        if self._divides(response):
            divide_toward_zero(flat_out, self.size)
        if post != 1.0:
            _scaled_copy(flat_out, flat_out, post)
        return out


# Dtypes whose Average divides each contribution by size before the sum instead of the
# sum after it: a factor below one cannot overflow, and the rounding differs by an ulp
# at most; float16/bfloat16 divide after the sum (their range is small). The choice
# depends on the response alone, so every rank contributes alike. The caller's own
# prescale and postscale stay where Horovod puts them (Product, Min and Max need that).
_DIVIDE_FIRST = frozenset({"float32", "float64"})


def _hand_out(block: np.ndarray, mine: list[Entry | None], group: list[Response]) -> list:
    """Results from a result block: views for callers that let the runtime own their
    result, copies for callers that gave an output."""
    results, offset = [], 0
    for entry, response in zip(mine, group):
        part = block[offset:offset + response.count]
        offset += response.count
        if entry is None:
            results.append(None)
        elif entry.output is not None:
            np.copyto(entry.output, part.reshape(entry.output.shape))
            results.append(entry.output)
        else:
            results.append(part.reshape(response.shape))
    return results


def _scaled_copy(out: np.ndarray, source: np.ndarray, factor: float) -> None:
    if factor == 1.0:
        if out is not source:  # adapters pass one array as input and output when in place
            np.copyto(out, source)
    else:
        np.multiply(source, factor, out=out, casting="unsafe")


def _fail(entries: list[Entry | None], error: BaseException) -> None:
    for entry in entries:
        if entry is not None:
            entry.finish(error=error)

"""Executes planned responses on this rank's entries and completes their handles.

Allreduce: the operation manager picks the backend (by op, dtype, size and how many
tensors are fused), and the backend runs the whole group (``allreduce_group``; by
default through the fusion buffer, fused_group.py). This module decides what the group
means: Average is Sum with a 1/size factor for floating types (float32/float64 apply
it on the way in, float16/bfloat16 on the way out); for integers a division toward
zero, or with a postscale a factor postscale/size, truncated (Horovod's results); and
where a large group is cut into pieces. A rank that has joined has no entry and
contributes zeros.
"""
from __future__ import annotations

from math import prod
from typing import Callable

import numpy as np

from ..errors import HorovodInternalError, RankMismatchError
from ..dtypes import FLOATING, numpy_dtype
from ..messages import ReduceOp, RequestType, Response
from ..entry import Entry, finish_all
from ..negotiation.eager_plan import EagerPlan
from ..timeline import Timeline, now_us
from .arithmetic import divide_toward_zero, reduce_ufunc, scale_into
from .cuda import DEVICE_CUDA
from .fused_group import AllreduceGroup, Workspace, hand_out, pack_inputs, scaled_copy
from .operations import OperationManager
from .piggyback import EagerGroup, EagerViews, gather_slices, reduce_gathered, reduce_my_slice
from .piggyback import pack as eager_pack


# Eager plans whose groups and views stay worked out (the predictor's periods go to 4).
_EAGER_PLANS_KEPT = 8

# Pack / reduce / copy out a large group in pieces of about this size (see _pieces).
PIPELINE_PIECE_BYTES = 1 << 20
# A group's tensor of this size or more may leave it for the backend it would take
# alone (see _runs): the group is cut into pieces at such a tensor anyway.
ALONE_BYTES = 2 * PIPELINE_PIECE_BYTES


def _reduction_counts(rows: int, size: int) -> list[int]:
    """Rows of a reducescatter per rank: the first rows % size ranks get one more."""
    base, extra = divmod(rows, size)
    return [base + (1 if r < extra else 0) for r in range(size)]


class Executor:
    def __init__(self, operations: OperationManager, rank: int, size: int) -> None:
        self.operations = operations
        self.rank = rank
        self.size = size
        self.workspace = Workspace()
        self.timeline: Timeline | None = None  # set by the runtime while recording
        self._marks: list[tuple[str, float]] = []
        # Recent eager plans' groups by plan (a loss and a metric in turn alternate two).
        self._eager: dict[int, EagerViews] = {}

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
            self.workspace.phase = self._phase
        else:
            self.workspace.phase = _no_phase
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
        if response.device == DEVICE_CUDA and kind in _WHOLE_ON_DEVICE:
            backend = self.operations.choose(kind, response.dtype, 0, device=response.device)
            self._phase(f"{backend.name.upper()}_{kind.name}")
            pre, post = self._scales(response, divide_first=False)
            return [backend.run_one(kind, response, entry,
                                    (pre, post, self.size if self._divides(response) else 0))]
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
        if self.size == 1 and first.device != DEVICE_CUDA:
            return self._allreduce_alone(self._allreduce_group(group, mine))
        dtype = numpy_dtype(first.dtype)
        counts = [r.count for r in group]
        op = ReduceOp.SUM if first.reduce_op == ReduceOp.AVERAGE else first.reduce_op
        backend = self.operations.choose(RequestType.ALLREDUCE, first.dtype,
                                         sum(counts) * dtype.itemsize, len(group), op,
                                         first.device)
        # The collectives must be the same on every rank, so runs and pieces follow from
        # the group alone, never from rank-local facts (whether this rank owns results,
        # has joined).
        runs = self._runs(counts, dtype.itemsize, backend, first, op)
        if len(runs) == 1:
            pieces = self._pieces(counts, dtype.itemsize, backend, first, op)
            return backend.allreduce_group(self._allreduce_group(group, mine, pieces))
        results, failure = [], None
        for start, end, run_backend in runs:  # a failed run must not skip a later one
            part, entries = group[start:end], mine[start:end]
            pieces = self._pieces(counts[start:end], dtype.itemsize, run_backend, first, op)
            try:
                results.extend(run_backend.allreduce_group(
                    self._allreduce_group(part, entries, pieces)))
            except Exception as exc:
                failure = failure or exc
                results.extend([None] * (end - start))
        if failure is not None:
            raise failure
        return results

    def _runs(self, counts: list[int], itemsize: int, backend, first: Response,
              op: ReduceOp) -> list[tuple[int, int, object]]:
        """A host group cut where a large tensor would go to another backend alone than
        the group goes to: each such tensor reduces by itself there, in its own output
        (no pack, no copy out), the tensors between them stay fused. A group of large
        tensors on shared memory goes tensor by tensor to the ring, which moves fewer
        bytes (8 x 32 MiB on 2 ranks: about half the time). Large: from ALONE_BYTES,
        where the group would go in pieces anyway, so such a tensor already costs a
        collective of its own; small ones stay fused whatever backend they would take
        alone (a burst of them is what fusion is for). (start, end, backend)."""
        if len(counts) < 2 or first.device == DEVICE_CUDA or \
                max(counts) * itemsize < ALONE_BYTES:
            return [(0, len(counts), backend)]
        runs: list[tuple[int, int, object]] = []
        start = 0
        for index, count in enumerate(counts):
            if count * itemsize < ALONE_BYTES:
                continue
            alone = self.operations.choose(RequestType.ALLREDUCE, first.dtype,
                                           count * itemsize, 1, op, first.device)
            if alone is backend:
                continue
            if index > start:
                runs.append((start, index, self._chosen(counts[start:index], itemsize,
                                                        first, op)))
            runs.append((index, index + 1, alone))
            start = index + 1
        if not runs:
            return [(0, len(counts), backend)]
        if start < len(counts):
            runs.append((start, len(counts), self._chosen(counts[start:], itemsize, first, op)))
        return runs

    def _chosen(self, counts: list[int], itemsize: int, first: Response, op: ReduceOp):
        return self.operations.choose(RequestType.ALLREDUCE, first.dtype,
                                      sum(counts) * itemsize, len(counts), op, first.device)

    def _allreduce_alone(self, spec: AllreduceGroup) -> list:
        """One rank: every reduction of one input is that input, so what is left is the
        scaling, applied as the fused path applies it (prescale, then postscale). An
        unscaled call in place costs nothing; a fusion buffer would cost a pack and a
        copy out (7 MB of gradients: 1.4 ms of a 12 ms step on a 2-core x86 machine)."""
        self._phase("LOCAL_ALLREDUCE")
        entries, pre, post = spec.entries, spec.prescale, spec.postscale
        if any(entry is not None and entry.output is None for entry in entries):
            block = spec.workspace.result_blocks.take(spec.dtype, sum(spec.counts))
            pack_inputs(block, entries, spec.counts, spec.dtype, pre)
            if post != 1.0:
                scale_into(block, block, post)
            return hand_out(block, entries, spec.responses)
        for entry in entries:
            if entry is not None:
                output = entry.output
                source = entry.tensor
                if source is not output:
                    source = source.reshape(output.shape)
                scaled_copy(output, source, pre)
                if post != 1.0:
                    scale_into(output, output, post)
        return [entry.output if entry is not None else None for entry in entries]

    def _allreduce_group(self, group: list[Response], mine: list[Entry | None],
                         pieces: list[tuple[int, int]] | None = None) -> AllreduceGroup:
        """What the backends get for a group: the reduction and scaling it means."""
        first = group[0]
        counts = [r.count for r in group]
        op = ReduceOp.SUM if first.reduce_op == ReduceOp.AVERAGE else first.reduce_op
        pre, post = self._scales(first)
        return AllreduceGroup(group, mine, counts, numpy_dtype(first.dtype), op, pre, post,
                              self.size if self._divides(first) else 0,
                              pieces or [(0, len(group))], self.workspace)

    # -- allreduce riding on the negotiation (piggyback.py) -------------------------------
    def _eager_views(self, plan: EagerPlan) -> EagerViews:
        """The plan's groups as this rank reduces them, worked out once per plan."""
        views = self._eager.get(id(plan))
        if views is None or views.plan is not plan:
            groups = []
            for group, offset in zip(plan.groups, plan.offsets):
                spec = self._allreduce_group(group, [])
                groups.append(EagerGroup(group, spec.counts, spec.dtype,
                                         reduce_ufunc(spec.dtype, spec.op), spec.prescale,
                                         spec.postscale, spec.divide_by, offset,
                                         sum(spec.counts) * spec.dtype.itemsize))
            if len(self._eager) >= _EAGER_PLANS_KEPT:
                self._eager.clear()
            views = self._eager[id(plan)] = EagerViews(plan, groups)
        return views

    def pack_eager(self, plan: EagerPlan, region: np.ndarray,
                   entry_of: Callable[[str], Entry | None]) -> bool:
        """This rank's tensors for the plan into its region; False if it has not got
        them all (the cycle then runs as any other, so an error is raised there)."""
        views = self._eager_views(plan)
        entries = []
        for names in views.names:
            mine = [entry_of(name) for name in names]
            if None in mine:
                return False
            entries.append(mine)
        try:
            eager_pack(views.of(region), views.groups, entries)
        except Exception:  # the ordinary path reports it
            return False
        return True

    def execute_gathered(self, plan: EagerPlan, index: int, mine: list[Entry | None],
                         rows: list[np.ndarray]) -> None:
        """execute() for the plan's group index, whose data every rank's region brought."""
        views = self._eager_views(plan)
        group = views.groups[index]
        try:
            stacked = views.stacked(rows)
            parts = views.parts(rows)[index] if stacked is None else stacked[index]
            results = reduce_gathered(group, parts, mine, self.workspace)
        except Exception as exc:
            _fail(mine, HorovodInternalError(
                f"allreduce of {', '.join(repr(r.name) for r in group.responses)} "
                f"failed: {exc}"))
            return
        finish_all(mine, results)

    def execute_split(self, plan: EagerPlan, entries: list[list[Entry | None]],
                      rows: list[np.ndarray], meet: Callable[[], None]) -> None:
        """execute_gathered for every group of a split plan: this rank reduces its slice
        of each, the ranks meet, then each copies every slice out. A failed reduction
        raises before the meeting: the others then wait there until the job is ended
        (``Runtime._fail``), rather than read a slice that was never reduced."""
        views = self._eager_views(plan)
        all_parts = views.parts(rows)
        for group, parts in zip(views.groups, all_parts):
            reduce_my_slice(group, parts, self.rank, self.workspace)
        meet()
        for group, parts, mine in zip(views.groups, all_parts, entries):
            try:
                results = gather_slices(group, parts, mine, self.workspace)
            except Exception as exc:  # a copy out: this rank's handles only
                _fail(mine, HorovodInternalError(
                    f"allreduce of {', '.join(repr(r.name) for r in group.responses)} "
                    f"failed: {exc}"))
                continue
            finish_all(mine, results)

    def abort(self, reason: str) -> None:
        """After a failure, on this rank alone: backends whose device work could wait
        for a lost peer give it up (NCCL's communicator abort)."""
        for backend in self.operations.backends:
            abort = getattr(backend, "abort", None)
            if abort is not None:
                abort(reason)

    def close(self) -> None:
        """Release what the backends hold (collective: every rank's runtime calls it
        after the same negotiated shutdown)."""
        for backend in self.operations.backends:
            close = getattr(backend, "close", None)
            if close is not None:
                close()
        self.workspace.copier.close()

    def _pieces(self, counts: list[int], itemsize: int, backend, first: Response,
                op: ReduceOp) -> list[tuple[int, int]]:
        """Consecutive runs of a group's tensors, each about PIPELINE_PIECE_BYTES, to pack,
        reduce and copy out one after the other: a 1 MiB fusion buffer stays in cache
        where a 4 MiB one does not (docs/tuning.md).
        One run when pieces would change the backend the group's size chose (the ring
        is faster for large buffers). Every rank cuts at the same tensors."""
        if not backend.pipelined or len(counts) < 2 or \
                sum(counts) * itemsize < 2 * PIPELINE_PIECE_BYTES or \
                self.operations.choose(RequestType.ALLREDUCE, first.dtype,
                                       PIPELINE_PIECE_BYTES, len(counts), op,
                                       first.device) is not backend:
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

    # -- the rest ---------------------------------------------------------------------
    def _allgather(self, response: Response, entry: Entry) -> np.ndarray:
        first_dims = response.first_dims
        assert first_dims is not None
        row_shape = response.shape[1:]
        owned = entry.allocate is None
        out = self._output_of(entry.allocate, response, (sum(first_dims),) + tuple(row_shape))
        row = prod(row_shape)
        counts = [d * row for d in first_dims]
        backend = self._backend(RequestType.ALLGATHER, response, sum(counts) * out.itemsize)
        self._phase(f"{backend.name.upper()}_ALLGATHER")
        if out.size:
            send, flat_out = entry.tensor.reshape(-1), out.reshape(-1)
            # An input that is this rank's part of the output is gathered in place (the
            # sharded optimizer's updated shard, inside the flat parameters).
            # (A block just taken cannot hold the input: a view would have kept it.)
            backend.allgatherv(None if not owned and _is_part(send, flat_out,
                                                              sum(counts[:self.rank]))
                               else send, flat_out, counts)
        return out

    def _output_of(self, allocate: Callable[[tuple[int, ...]], np.ndarray] | None,
                   response: Response, shape: tuple[int, ...]) -> np.ndarray:
        """The caller's allocation, or, without one, a view of a runtime-owned result
        block (reused once the caller drops every view of it): a fresh output would
        fault its pages in on every call (a 32 MiB allgather result: 15 ms here)."""
        if allocate is not None:
            return allocate(shape)
        block = self.workspace.result_blocks.take(numpy_dtype(response.dtype), prod(shape))
        return block.reshape(shape)

    def _broadcast(self, response: Response, entry: Entry) -> np.ndarray:
        out = entry.output
        if out is None:
            out = self._output_of(None, response, response.shape)
        backend = self._backend(RequestType.BROADCAST, response, out.nbytes)
        self._phase(f"{backend.name.upper()}_BROADCAST")
        if self.rank == response.root_rank and out is not entry.tensor:
            # Out of place, the root sends from its input and the backend fills its
            # output (no one else reads it: cheap to write).
            if out.size:
                backend.bcast(entry.tensor.reshape(-1), response.root_rank, out.reshape(-1))
        elif out.size:
            backend.bcast(out.reshape(-1), response.root_rank)
        return out

    def _alltoall(self, response: Response, entry: Entry) -> tuple[np.ndarray, np.ndarray]:
        splits = response.splits
        assert splits is not None
        row_shape = tuple(entry.tensor.shape[1:])
        row = prod(row_shape)
        received = [splits[src][self.rank] for src in range(self.size)]
        out = self._output_of(entry.allocate, response, (sum(received),) + row_shape)
        backend = self._backend(RequestType.ALLTOALL, response, entry.tensor.nbytes)
        self._phase(f"{backend.name.upper()}_ALLTOALL")
        first = splits[0][0] if splits and splits[0] else 0
        uniform = all(count == first for sends in splits for count in sends)
        backend.alltoallv(entry.tensor.reshape(-1), [s * row for s in splits[self.rank]],
                          out.reshape(-1), [s * row for s in received], uniform=uniform)
        return out, np.asarray(received, dtype=np.int32)

    def _reducescatter(self, response: Response, entry: Entry) -> np.ndarray:
        rows = response.shape[0] if response.shape else 0
        row = prod(response.shape[1:])
        parts = _reduction_counts(rows, self.size)
        counts = [c * row for c in parts]
        out = entry.output
        if out is None:
            out = self._output_of(None, response, (parts[self.rank],) + tuple(response.shape[1:]))
        dtype = numpy_dtype(response.dtype)
        send = entry.tensor.reshape(-1)
        if response.prescale != 1.0:  # else straight from the input: no copy, no buffer
            send = self.workspace.buffers.get(dtype, sum(counts))
            scaled_copy(send, entry.tensor.reshape(-1), response.prescale)
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
            scaled_copy(flat_out, flat_out, post)
        return out


# Run whole by a device-memory backend when their views are CUDA memory.
_WHOLE_ON_DEVICE = frozenset({RequestType.ALLGATHER, RequestType.BROADCAST,
                              RequestType.ALLTOALL, RequestType.REDUCESCATTER})

# Dtypes whose Average divides each contribution by size before the sum instead of the
# sum after it: a factor below one cannot overflow, and the rounding differs by an ulp
# at most; float16/bfloat16 divide after the sum (their range is small). The choice
# depends on the response alone, so every rank contributes alike. The caller's own
# prescale and postscale stay where Horovod puts them (Product, Min and Max need that).
_DIVIDE_FIRST = frozenset({"float32", "float64"})


def _is_part(part: np.ndarray, whole: np.ndarray, offset: int) -> bool:
    """part is whole[offset:offset + part.size] itself (same memory, same dtype)."""
    return part.size > 0 and part.dtype == whole.dtype and \
        part.__array_interface__["data"][0] == \
        whole.__array_interface__["data"][0] + offset * whole.itemsize


def _no_phase(phase: str) -> None:
    """No timeline: phases are not marked."""


def _fail(entries: list[Entry | None], error: BaseException) -> None:
    for entry in entries:
        if entry is not None:
            entry.finish(error=error)

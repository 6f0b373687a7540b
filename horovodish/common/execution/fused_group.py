"""The fusion-buffer path: how a backend with a flat allreduce runs a fused group.

Pack the group's inputs (prescaled) into one flat buffer, reduce it with the backend's
``reduce_fused``, copy the results out (postscaled). A group of 2 MiB or more goes in
pieces of about 1 MiB (pack, reduce, copy out, next piece), which keeps the buffer in
cache; the executor cuts the pieces, the same on every rank. One tensor reduces in its
own output; callers that let the runtime own their result get views of a result block,
with no copy out. ``Backend.allreduce_group`` runs this unless a backend has a better
way (shared memory packs straight into memory the other ranks read).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol

import numpy as np

from ..messages import ReduceOp, Response
from ..entry import Entry
from .arithmetic import divide_toward_zero, scale_into, scale_once
from .datatype_copies import MIN_OUTPUTS, DatatypeCopier
from .buffers import FusionBuffers, ResultBlocks


def _no_phase(phase: str) -> None:
    """Timeline phases are marked only while a timeline records."""


@dataclass
class Workspace:
    """What the groups of one runtime share: the persistent fusion buffers, the result
    blocks, the datatype copier, and where to mark timeline phases."""
    buffers: FusionBuffers = field(default_factory=FusionBuffers)
    result_blocks: ResultBlocks = field(default_factory=ResultBlocks)
    copier: DatatypeCopier = field(default_factory=DatatypeCopier)
    phase: Callable[[str], None] = _no_phase


@dataclass
class AllreduceGroup:
    """One negotiated allreduce group as this rank runs it.

    ``entries[i]`` is this rank's entry for ``responses[i]`` (None where it has joined:
    it contributes zeros). ``op`` is the reduction to run (Average arrives as Sum);
    ``prescale``/``postscale`` are the factors as applied (Average's 1/size folded into
    one of them); ``divide_by``, if not 0, is an integer Average's exact division of the
    sum. ``pieces`` are runs of consecutive tensors to reduce one after the other."""
    responses: list[Response]
    entries: list[Entry | None]
    counts: list[int]
    dtype: np.dtype
    op: ReduceOp
    prescale: float
    postscale: float
    divide_by: int
    pieces: list[tuple[int, int]]
    workspace: Workspace


class FlatReducer(Protocol):
    name: str

    def reduce_fused(self, buf: np.ndarray, counts: list[int], op: ReduceOp,
                     source: np.ndarray | None = None) -> None: ...


class _CopyFailed(Exception):
    """A local copy into or out of the fusion buffer failed; the collective still ran."""


def through_fusion_buffer(backend: FlatReducer, group: AllreduceGroup) -> list:
    """Run group with backend's flat reduction; the results, one per entry."""
    entries, counts, workspace = group.entries, group.counts, group.workspace
    owned = any(entry is not None and entry.output is None for entry in entries)
    if len(entries) == 1 and entries[0] is not None and (
            owned or entries[0].output.flags.c_contiguous):
        return [_single(backend, group, entries[0], owned)]
    if not owned:
        failure = None
        for start, end in group.pieces:  # a failed copy must not skip a later collective
            try:
                _reduce_to_outputs(backend, group, entries[start:end], counts[start:end])
            except _CopyFailed as exc:
                failure = failure or exc.__cause__
        if failure is not None:
            raise failure
        return [entry.output if entry is not None else None for entry in entries]
    # Some caller lets the runtime own its result: reduce the group in a result block,
    # in the same pieces, though the block is contiguous.
    buf = workspace.result_blocks.take(group.dtype, sum(counts))
    workspace.phase("MEMCPY_IN_FUSION_BUFFER")
    offset, failure = 0, None
    for start, end in group.pieces:
        size = sum(counts[start:end])
        part = buf[offset:offset + size]
        try:
            pack_inputs(part, entries[start:end], counts[start:end], group.dtype, group.prescale)
        except Exception as exc:  # never skip a collective the others will run
            failure = failure or exc
            part.fill(0)
        _reduce(backend, group, part, counts[start:end])
        offset += size
    if failure is not None:
        raise failure
    if group.postscale != 1.0:  # reduced where the caller reads it
        scale_into(buf, buf, group.postscale)
    return hand_out(buf, entries, group.responses)


def _single(backend: FlatReducer, group: AllreduceGroup, entry: Entry, owned: bool
            ) -> np.ndarray:
    """One tensor reduces where the caller reads it (its output, or a result block),
    straight from its input when that is another array: no copy pass of its own."""
    if owned:
        buf = group.workspace.result_blocks.take(group.dtype, group.counts[0])
    else:
        buf = entry.output.reshape(-1)
    source = entry.tensor.reshape(-1)
    group.workspace.phase("MEMCPY_IN_FUSION_BUFFER")
    # MPI refuses aliased buffers. A block just taken cannot overlap the input (a view
    # of it would have kept it taken); a caller's output can.
    if entry.tensor is entry.output or group.prescale != 1.0 or \
            (not owned and np.may_share_memory(buf, source)):
        scaled_copy(buf, source, group.prescale)
        _reduce(backend, group, buf, group.counts)
    else:
        _reduce(backend, group, buf, group.counts, source)
    if group.postscale != 1.0:
        scale_into(buf, buf, group.postscale)
    return buf.reshape(group.responses[0].shape) if owned else entry.output


def _reduce_to_outputs(backend: FlatReducer, group: AllreduceGroup,
                       entries: list[Entry | None], counts: list[int]) -> None:
    """Pack, reduce and copy out to the callers' outputs."""
    workspace = group.workspace
    buf = workspace.buffers.get(group.dtype, sum(counts))
    workspace.phase("MEMCPY_IN_FUSION_BUFFER")
    try:
        pack_inputs(buf, entries, counts, group.dtype, group.prescale)
    except Exception as exc:
        buf.fill(0)  # still take part in the collective, contributing nothing
        _reduce(backend, group, buf, counts)
        raise _CopyFailed() from exc
    _reduce(backend, group, buf, counts)
    try:
        unpack_outputs(workspace.copier, buf, entries, counts, group.postscale)
    except Exception as exc:
        raise _CopyFailed() from exc


def _reduce(backend: FlatReducer, group: AllreduceGroup, buf: np.ndarray,
            counts: list[int], source: np.ndarray | None = None) -> None:
    phase = group.workspace.phase
    phase(f"{backend.name.upper()}_ALLREDUCE")
    backend.reduce_fused(buf, counts, group.op, source)
    phase("MEMCPY_OUT_FUSION_BUFFER")
    if group.divide_by:
        divide_toward_zero(buf, group.divide_by)


def pack_inputs(buf: np.ndarray, entries: list[Entry | None], counts: list[int],
          dtype: np.dtype, prescale: float) -> None:
    """All inputs into the fusion buffer: one C call (then one scaling pass, for many
    small tensors), or one scaled copy per tensor (zeros for a joined rank)."""
    scale_after = prescale != 1.0 and scale_once(buf.nbytes, len(entries))
    if prescale == 1.0 or scale_after:
        parts = [entry.tensor if entry is not None else np.zeros(count, dtype)
                 for entry, count in zip(entries, counts)]
        np.concatenate(parts, axis=None, out=buf)  # flattens in C
        if scale_after:
            scale_into(buf, buf, prescale)
        return
    offset = 0
    for entry, count in zip(entries, counts):
        target = buf[offset:offset + count]
        if entry is None:
            target.fill(0)
        else:
            scale_into(target, entry.tensor.reshape(-1), prescale)
        offset += count


def unpack_outputs(copier: DatatypeCopier, buf: np.ndarray, entries: list[Entry | None],
            counts: list[int], post: float) -> None:
    """The fusion buffer out to the callers' outputs, scaled by post: a few tensors
    scale on the way out (one pass), many are copied out in one C call."""
    if len(entries) < MIN_OUTPUTS:
        offset = 0
        for entry, count in zip(entries, counts):
            if entry is not None:
                output = entry.output
                scaled_copy(output, buf[offset:offset + count].reshape(output.shape), post)
            offset += count
        return
    if post != 1.0:
        scale_into(buf, buf, post)
    copier.copy_out(buf, [e.output if e is not None else None for e in entries], counts,
                    sized=True)


def hand_out(block: np.ndarray, entries: list[Entry | None],
             responses: list[Response]) -> list:
    """Results from a result block: views for callers that let the runtime own their
    result, copies for callers that gave an output."""
    if len(entries) == 1 and entries[0] is not None and entries[0].output is None and \
            block.shape == responses[0].shape:  # one flat tensor: the block as it is
        return [block]  # (a slice and a reshape cost a third of a small call's 1 us)
    results, offset = [], 0
    for entry, response in zip(entries, responses):
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


def scaled_copy(out: np.ndarray, source: np.ndarray, factor: float) -> None:
    if factor == 1.0:
        if out is not source:  # adapters pass one array as input and output when in place
            np.copyto(out, source)
    else:
        scale_into(out, source, factor)

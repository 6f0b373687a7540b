"""Each rank's uncached requests as one compact record, read at the coordinator by group.

On a cache miss every rank sends the coordinator its requests. At thousands of ranks
nearly all of them send the same list (the same names, dtypes, shapes and ops), so rank
0 must not unpickle and compare thousands of equal lists one request at a time. Each
rank's record is therefore:

    digest (16 bytes) | n (int64) | n varying ints (int64) | the agreed part, pickled

The *agreed part* is everything every rank must submit identically (for allgather and
alltoall the first dimension and the splits are left out of it: they may differ by
rank); the *varying ints* are exactly those left-out numbers, in request order. The
digest is BLAKE2b of the pickled agreed part, so rank 0 groups the ranks by digest in one
numpy call, unpickles one list per group, and reads each group's varying ints as one
(ranks, n) matrix. A job whose ranks agree costs rank 0 one unpickle, whatever its size;
ranks that differ form groups of their own and are read, and named, in full.
"""
from __future__ import annotations

import hashlib
import io
import pickle
import struct
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..messages import ReduceOp, Request, RequestType

HEADER_BYTES = 24  # digest (16) + number of varying ints (8)
_DIGEST_BYTES = 16
_ALLGATHER = RequestType.ALLGATHER
_ALLTOALL = RequestType.ALLTOALL
_REQUEST_TYPES = tuple(RequestType)
_REDUCE_OPS = {int(op): op for op in ReduceOp}


def varying_width(request: Request) -> int:
    """How many varying ints a request (as agreed, splits replaced by their count) has."""
    if request.type is _ALLGATHER:
        return 1
    if request.type is _ALLTOALL:
        return 1 + (request.splits[0] if request.splits is not None else 0)
    return 0


def encode(requests: Sequence[Request]) -> bytes:
    """This rank's record of its uncached requests (in its submit order)."""
    agreed: list[tuple] = []
    varying: list[int] = []
    for request in requests:
        kind, shape, splits = request.type, request.shape, request.splits
        if kind is _ALLGATHER or kind is _ALLTOALL:
            varying.append(int(shape[0]) if shape else 0)
            if splits is not None:
                varying.extend(int(split) for split in splits)
                splits = (len(splits),)
            if shape:
                shape = (-1,) + tuple(shape[1:])
        # Plain ints and tuples: equal requests pickle to equal bytes on every rank.
        agreed.append((request.name, int(kind), request.dtype, tuple(shape),
                       int(request.reduce_op), int(request.root_rank), float(request.prescale),
                       float(request.postscale), request.device, splits))
    body = _dumps(agreed)
    digest = hashlib.blake2b(body, digest_size=_DIGEST_BYTES).digest()
    return b"".join((digest, struct.pack("<q", len(varying)),
                     np.asarray(varying, dtype="<i8").tobytes(), body))


def _dumps(agreed: list[tuple]) -> bytes:
    """Pickle without the memo: two ranks whose strings happen to be one object on one
    and two equal objects on the other still write the same bytes."""
    out = io.BytesIO()
    pickler = pickle.Pickler(out, protocol=pickle.HIGHEST_PROTOCOL)
    pickler.fast = True
    pickler.dump(agreed)
    return out.getvalue()


def _decode_agreed(body: memoryview) -> list[Request]:
    types, ops = _REQUEST_TYPES, _REDUCE_OPS
    new = tuple.__new__
    return [new(Request, (name, types[kind], dtype, shape, ops[op], root, pre, post, device,
                          splits))
            for name, kind, dtype, shape, op, root, pre, post, device, splits
            in pickle.loads(body)]


@dataclass
class RecordGroup:
    """Ranks that sent the same agreed list. ``varying[i]`` is ranks[i]'s varying ints
    (one row per rank, columns in request order: see ``varying_width``)."""

    ranks: np.ndarray  # ascending, of the transport (set ranks)
    requests: list[Request]  # as agreed: allgather/alltoall first dimensions are -1
    varying: np.ndarray  # int64, (len(ranks), n)


class GatheredRecords:
    """Every rank's record as a byte gather delivers them: one buffer, and where each
    rank's record starts (offsets[r]) and ends (offsets[r + 1]). Nothing read from it
    refers to the buffer (the varying ints are copies), so a transport may reuse it."""

    def __init__(self, buffer: np.ndarray, offsets: np.ndarray) -> None:
        self.buffer = buffer
        self.offsets = offsets
        self.size = len(offsets) - 1

    @classmethod
    def of(cls, records: Sequence[bytes]) -> GatheredRecords:
        """Records joined as a gather delivers them (fakes, the simulation bench)."""
        lengths = np.fromiter((len(record) for record in records), dtype=np.int64,
                              count=len(records))
        offsets = np.zeros(len(records) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return cls(np.frombuffer(b"".join(records), dtype=np.uint8), offsets)

    def groups(self) -> list[RecordGroup]:
        """The ranks grouped by agreed list, ordered by each group's lowest rank (so a
        name arrives, as before grouping, in rank order, then in that rank's order)."""
        size, buffer, offsets = self.size, self.buffer, self.offsets
        if size == 0:
            return []
        starts = offsets[:-1]
        lengths = np.diff(offsets)
        width = int(lengths[0])
        rows = None
        if (lengths == width).all():  # the usual case: every record the same length
            rows = buffer[:size * width].reshape(size, width)
            heads = rows[:, :HEADER_BYTES]
        else:
            heads = buffer[starts[:, None] + np.arange(HEADER_BYTES)]
        digests = np.ascontiguousarray(heads[:, :_DIGEST_BYTES]).view(
            f"V{_DIGEST_BYTES}").ravel()
        counts = np.ascontiguousarray(heads[:, _DIGEST_BYTES:]).view("<i8").ravel()
        if (digests == digests[0]).all():
            members = [np.arange(size)]
        else:
            _, first, inverse = np.unique(digests, return_index=True, return_inverse=True)
            by_group = np.argsort(inverse.ravel(), kind="stable")
            bounds = np.cumsum(np.bincount(inverse.ravel()))[:-1]
            members = [members_ for _, members_ in sorted(
                zip(first.tolist(), np.split(by_group, bounds)), key=lambda pair: pair[0])]
        groups = []
        view = memoryview(buffer)
        for ranks in members:
            exemplar = int(ranks[0])
            n = int(counts[exemplar])
            start = int(starts[exemplar]) + HEADER_BYTES
            requests = _decode_agreed(view[start + 8 * n:int(offsets[exemplar + 1])])
            if n == 0:
                varying = np.empty((len(ranks), 0), dtype=np.int64)
            elif rows is not None and len(ranks) == size:  # (a copy: see below)
                varying = rows[:, HEADER_BYTES:HEADER_BYTES + 8 * n].view("<i8").copy()
            elif rows is not None:
                varying = rows[ranks, HEADER_BYTES:HEADER_BYTES + 8 * n].view("<i8")
            else:
                at = starts[ranks][:, None] + HEADER_BYTES + np.arange(8 * n)
                varying = buffer[at].view("<i8")
            groups.append(RecordGroup(ranks, requests, varying))
        return groups

"""Every collective on tensors past 2**31 elements (int8) and past 2**31 bytes (float32),
through the core API, checked against the pattern each rank sent: value k of rank r's
tensor is (k % 37) + r + 1, compared element by element in windows (both ends, around
2**31, spread between) and summed over every element, so an element read from the wrong
place, rank or half of the index range is caught. Two buffers of 2 GiB per rank are
filled once and reused: in a VM every fresh page costs a fault, and the test would
otherwise spend its time there."""
from __future__ import annotations

import sys

import numpy as np
from mpi4py import MPI

from worker_support import check, run_checks  # noqa: E402

from horovodish.common import api  # noqa: E402
from horovodish.common.api import collectives  # noqa: E402
from horovodish.common.messages import ReduceOp  # noqa: E402

ELEMENTS = (1 << 31) + 24  # int8: past 2**31 elements
FLOATS = (1 << 29) + 40  # float32: past 2**31 bytes
PERIOD = 37  # prime: the pattern never lines up with a power of two


def fill(out: np.ndarray, rank: int) -> np.ndarray:
    """The pattern written into out in place (doubling copies: no temporary)."""
    out[:PERIOD] = (np.arange(PERIOD) + rank + 1)[:out.size]
    done = PERIOD
    while done < out.size:
        step = min(done, out.size - done)
        out[done:done + step] = out[:step]  # PERIOD divides done: the phase holds
        done += step
    return out


class Buffers:
    """This rank's two reusable 2 GiB buffers: its input pattern and a scratch output."""

    def __init__(self, rank: int) -> None:
        self.base = fill(np.empty(ELEMENTS, np.int8), rank)
        self.scratch = np.empty(max(ELEMENTS, 4 * FLOATS) + 64, np.int8)

    def take(self, count: int, dtype=np.int8) -> np.ndarray:
        return self.scratch[:count * np.dtype(dtype).itemsize].view(dtype)

    def allocate(self, shape: tuple[int, ...]) -> np.ndarray:
        """An output the runtime asks for (allgather, alltoall): the scratch buffer."""
        return self.take(int(np.prod(shape))).reshape(shape)


def _windows(count: int) -> list[tuple[int, int]]:
    """Where to compare: both ends, around 2**31 elements and 2**31 bytes, and spread
    windows between (the same on every rank)."""
    width = 1 << 16
    starts = [0, count - width, (1 << 31) - width // 2, (1 << 29) - width // 2]
    starts += np.random.default_rng(count).integers(0, count - width, 48).tolist()
    return sorted({(max(0, min(int(a), count - width)), width) for a in starts if count > 0})


def matches(got: np.ndarray, first: int, scale: int, add: int, what: str) -> bool:
    """got[k] == scale * ((first + k) % PERIOD) + add in every window of _windows, and
    the sum of every element equals the pattern's (so no stretch between goes unseen)."""
    kind = got.dtype.type
    for start, width in _windows(got.size):
        k = np.arange(start, start + width)
        want = (((first + k) % PERIOD) * scale + add).astype(got.dtype)
        bad = np.flatnonzero(got[start:start + width] != want)
        if bad.size:
            at = start + int(bad[0])
            return check(False, f"{what}: element {at} is {got[at]}, want {want[bad[0]]}")
    # Every element: the sum over whole periods plus the rest, in int64.
    values = (np.arange(PERIOD) * scale + add).astype(got.dtype).astype(np.int64)
    phase = first % PERIOD
    cycle = np.roll(values, -phase)
    full, rest = divmod(got.size, PERIOD)
    want_sum = full * int(cycle.sum()) + int(cycle[:rest].sum())
    got_sum = int(np.add.reduce(got, dtype=np.int64 if kind(0).dtype.kind in "iu"
                                else np.float64))
    return check(got_sum == want_sum, f"{what}: elements sum to {got_sum}, want {want_sum}")


def allreduce_out_and_in_place(rank: int, size: int, buffers: Buffers) -> None:
    total = sum(r + 1 for r in range(size))
    out = collectives.allreduce_async(buffers.base, None, "big.ar", ReduceOp.SUM).wait()
    check(out.size == ELEMENTS, f"allreduce: {out.size} elements")
    matches(out, 0, size, total, "allreduce of 2**31 + 24 int8")
    del out
    mine = buffers.take(ELEMENTS)
    mine[:] = buffers.base
    collectives.allreduce_async(mine, mine, "big.ar_", ReduceOp.SUM).wait()
    matches(mine, 0, size, total, "allreduce_ of 2**31 + 24 int8")
    floats = fill(buffers.take(FLOATS, np.float32), rank)
    collectives.allreduce_async(floats, floats, "big.ar_.float32", ReduceOp.SUM).wait()
    matches(floats, 0, size, total, "allreduce_ of 2**29 + 40 float32 (past 2**31 bytes)")


def broadcast_in_place(rank: int, size: int, buffers: Buffers) -> None:
    root = size - 1
    mine = buffers.take(ELEMENTS)
    if rank == root:
        mine[:] = buffers.base
    else:
        mine[:] = 0
    collectives.broadcast_async(mine, mine, root, "big.bcast").wait()
    matches(mine, 0, 1, root + 1, "broadcast_ of 2**31 + 24")


def allgather_past_two_gib(rank: int, size: int, buffers: Buffers) -> None:
    rows = ELEMENTS // size + 8 + rank  # ranks differ in length: past 2**31 in all
    lengths = [ELEMENTS // size + 8 + r for r in range(size)]
    got = collectives.allgather_async(buffers.base[:rows], buffers.allocate, "big.ag").wait()
    check(got.size == sum(lengths), f"allgather: {got.size} elements")
    start = 0
    for r, length in enumerate(lengths):
        matches(got[start:start + length], 0, 1, r + 1, f"allgather: rank {r}'s part")
        start += length


def reducescatter_past_two_gib(rank: int, size: int, buffers: Buffers) -> None:
    total = sum(r + 1 for r in range(size))
    (handle,) = collectives.grouped_reducescatter_async([buffers.base], [None], ["big.rs"],
                                                        ReduceOp.SUM)
    got = handle.wait()
    sizes = MPI.COMM_WORLD.allgather(got.size)
    check(sum(sizes) == ELEMENTS, f"reducescatter: parts of {sizes}")
    matches(got, sum(sizes[:rank]), size, total, "reducescatter: this rank's part")


def alltoall_past_two_gib(rank: int, size: int, buffers: Buffers) -> None:
    splits = [ELEMENTS // size] * (size - 1) + [ELEMENTS - (size - 1) * (ELEMENTS // size)]
    starts = [sum(splits[:d]) for d in range(size)]
    got = collectives.alltoall_async(buffers.base, splits, buffers.allocate, "big.a2a").wait()
    received = got[0] if isinstance(got, tuple) else got
    check(received.size == size * splits[rank], f"alltoall: {received.size} elements")
    for sender in range(size):
        # Sender s's block for this rank is elements starts[rank]... of s's tensor.
        block = received[sender * splits[rank]:(sender + 1) * splits[rank]]
        matches(block, starts[rank], 1, sender + 1, f"alltoall: the block from rank {sender}")


if __name__ == "__main__":
    api.init()
    every = [allreduce_out_and_in_place, broadcast_in_place, allgather_past_two_gib,
             reducescatter_past_two_gib, alltoall_past_two_gib]
    named = set(sys.argv[1:])  # the checks to run; none named: every one
    run_checks([c for c in every if not named or c.__name__ in named], api.rank(),
               api.size(), Buffers(api.rank()))
    api.shutdown()

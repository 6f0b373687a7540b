"""The shared-memory allreduce on real ranks, against numpy, with tiny pieces so that
tensors straddle pieces, fill several, and alternate between the two halves."""
from __future__ import annotations

import sys

import ml_dtypes
import numpy as np
from mpi4py import MPI

from horovodish.common.execution.backends.shm import SharedMemoryBackend, _plan
from horovodish.common.messages import ReduceOp

PIECE_BYTES = 4096
DTYPES = [np.float32, np.float64, np.float16, ml_dtypes.bfloat16, np.int32, np.int64,
          np.uint8, np.bool_]
OPS = [ReduceOp.SUM, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT]
# Lengths: a tensor split over pieces, runs of whole tensors, zero-element tensors.
LAYOUTS = [[3000], [10, 0, 500, 2000, 7, 1024, 1025, 3], [0, 0], [1], [1024, 1024, 1024]]

NUMPY_OPS = {ReduceOp.SUM: np.add, ReduceOp.MIN: np.minimum, ReduceOp.MAX: np.maximum,
             ReduceOp.PRODUCT: np.multiply}


def contribution(rank: int, count: int, dtype, op: ReduceOp, seed: int) -> np.ndarray:
    """Small integers, so every dtype sums and multiplies exactly."""
    rng = np.random.default_rng(seed * 31 + rank)
    if dtype == np.bool_:
        return rng.integers(0, 2, count).astype(np.bool_)
    # Signed integers go negative: an integer Average then divides toward zero.
    low, high = (1, 3) if op == ReduceOp.PRODUCT else ((-3, 4) if np.dtype(dtype).kind == "i" else (0, 4))
    return rng.integers(low, high, count).astype(dtype)


def reference(size: int, counts: list[int], dtype, op: ReduceOp, seed: int,
              joined: int | None, prescale: float, postscale: float,
              floor_by: int) -> np.ndarray:
    parts = []
    for rank in range(size):
        if rank == joined:
            parts.append(np.zeros(sum(counts)))
            continue
        values = [contribution(rank, c, dtype, op, seed + i) for i, c in enumerate(counts)]
        parts.append((np.concatenate(values) if values else np.zeros(0)).astype(np.float64)
                     * prescale)
    if dtype == np.bool_:
        table = {ReduceOp.SUM: np.logical_or, ReduceOp.MAX: np.logical_or,
                 ReduceOp.MIN: np.logical_and, ReduceOp.PRODUCT: np.logical_and}
        return table[op].reduce(np.stack(parts).astype(bool), axis=0)
    total = NUMPY_OPS[op].reduce(np.stack(parts), axis=0)
    if floor_by:
        total = np.sign(total) * (np.abs(total) // floor_by)  # toward zero
    return total * postscale


def main() -> None:
    comm = MPI.COMM_WORLD.Dup()
    rank, size = comm.Get_rank(), comm.Get_size()
    # As a process set's would be: messages name rank r as world rank r + 10.
    backend = SharedMemoryBackend(comm, "shm", piece_bytes=PIECE_BYTES,
                                  world_ranks=[r + 10 for r in range(size)])
    assert backend.available, "the shared-memory window must open on one host"
    checked = 0
    for seed, (dtype, op, counts) in enumerate(
            (d, o, c) for d in DTYPES for o in OPS for c in LAYOUTS):
        dtype = np.dtype(dtype)
        is_int = dtype.kind in "iu"
        floor_by = size if is_int and op == ReduceOp.SUM and seed % 2 else 0
        scaled = dtype.kind == "f" and op == ReduceOp.SUM and seed % 3 == 0
        prescale, postscale = (0.5, 4.0) if scaled else (1.0, 1.0)
        joined = 1 if seed % 5 == 0 and op == ReduceOp.SUM else None
        inputs = [None if rank == joined else contribution(rank, c, dtype, op, seed * 100 + i)
                  for i, c in enumerate(counts)]
        expected = reference(size, counts, dtype, op, seed * 100, joined, prescale, postscale,
                             floor_by)
        if seed % 4 == 3:  # one flat output for everything (a result block)
            block = np.full(sum(counts), 7, dtype)
            backend.allreduce_into(inputs, counts, block, dtype, op, prescale, postscale,
                                   floor_by)
            got = block.astype(np.float64)
        else:  # one output per input, the first strided (no flat view)
            outputs = [np.full(c, 7, dtype) for c in counts]
            if counts and counts[0]:
                outputs[0] = np.full((counts[0], 2), 7, dtype)[:, 0]
            backend.allreduce_into(inputs, counts, outputs, dtype, op, prescale, postscale,
                                   floor_by)
            got = np.concatenate([o.astype(np.float64) for o in outputs]) if outputs \
                else np.zeros(0)
        assert np.array_equal(got, expected.astype(np.float64)), (
            f"rank {rank}: {dtype} {op.name} counts {counts} joined {joined} "
            f"pre {prescale} post {postscale} floor {floor_by}:\n{got}\n{expected}")
        checked += 1
    # Back-to-back calls where rank 0 copies results out fast (contiguous outputs) and
    # the others slowly (strided ones): rank 0 must not overwrite shared data that a
    # slower rank is still reading.
    for step in range(300):
        counts = [700, 1500, 300] if step % 2 else [2500]
        inputs = [np.full(c, rank * 1000 + step + i, np.float32) for i, c in enumerate(counts)]
        outputs = [np.empty(c, np.float32) if rank == 0 else np.empty((c, 3), np.float32)[:, 1]
                   for c in counts]
        backend.allreduce_into(inputs, counts, outputs, np.dtype(np.float32), ReduceOp.SUM)
        for i, output in enumerate(outputs):
            expected = sum(r * 1000 + step + i for r in range(size))
            assert np.all(output == expected), (rank, step, i, output, expected)
    # A copy that fails on one rank: the ranks stay in step (no hang), a failed pack makes
    # every rank raise (their sums would be wrong), a failed copy-out only that rank.
    f32 = np.dtype(np.float32)
    counts = [1500, 3000]
    good = [np.ones(c, np.float32) for c in counts]
    bad_input = [np.ones(1500, np.float32), np.ones(10, np.float32)]  # too short to pack
    try:
        backend.allreduce_into(bad_input if rank == 1 else good, counts,
                               [np.empty(c, np.float32) for c in counts], f32, ReduceOp.SUM)
        raise AssertionError(f"rank {rank}: a rank's failed pack must fail every rank")
    except (ValueError, RuntimeError) as exc:
        assert rank == 1 or "rank 11 could not copy its input" in str(exc), exc
    outputs = [np.empty(c, np.float32) for c in counts]
    if rank == 1:
        outputs[1] = np.empty(7, np.float32)  # too short to receive
    try:
        backend.allreduce_into(good, counts, outputs, f32, ReduceOp.SUM)
        assert rank != 1, "a failed copy-out must raise on its rank"
        assert all(np.all(o == size) for o in outputs), outputs
    except ValueError:
        assert rank == 1
    outputs = [np.empty(c, np.float32) for c in counts]  # and the next call works
    backend.allreduce_into(good, counts, outputs, f32, ReduceOp.SUM)
    assert all(np.all(o == size) for o in outputs), outputs
    # In place (each output is its input), many tensors a piece: one datatype of the
    # tensors' addresses packs and copies out; a strided tensor falls back to the loops.
    for strided in (False, True):
        counts = [(37 * i) % 113 for i in range(90)]  # some empty, several pieces
        seed = 500 + strided
        tensors = [contribution(rank, c, np.float32, ReduceOp.SUM, seed + i)
                   for i, c in enumerate(counts)]
        if strided:
            tensors[5] = np.repeat(tensors[5], 2)[::2]
        backend.allreduce_into(tensors, counts, tensors, f32, ReduceOp.SUM, in_place=True)
        for i, (tensor, c) in enumerate(zip(tensors, counts)):
            expected = sum(contribution(r, c, np.float32, ReduceOp.SUM, seed + i)
                           for r in range(size))
            assert np.array_equal(tensor, expected), (rank, strided, i)
    # Describing the tensors fails on rank 1 only: a failed pack like any other (every
    # rank raises, no rank skips a barrier), and the next call works.
    counts = [40] * 40
    tensors = [np.ones(c, np.float32) for c in counts]
    if rank == 1:
        backend._copier.describe = lambda *args, **kwargs: (_ for _ in ()).throw(
            MemoryError("no datatype"))
    try:
        backend.allreduce_into(tensors, counts, tensors, f32, ReduceOp.SUM, in_place=True)
        raise AssertionError(f"rank {rank}: a failed describe must fail every rank")
    except (MemoryError, RuntimeError) as exc:
        assert rank == 1 or "rank 11 could not copy its input" in str(exc), exc
    if rank == 1:
        del backend._copier.describe  # the class's method again
    tensors = [np.ones(c, np.float32) for c in counts]
    backend.allreduce_into(tensors, counts, tensors, f32, ReduceOp.SUM, in_place=True)
    assert all(np.all(t == size) for t in tensors), tensors
    # In place through the Backend interface, across several pieces.
    buf = contribution(rank, 5000, np.float32, ReduceOp.SUM, 99)
    backend.allreduce(buf, ReduceOp.SUM)
    assert np.array_equal(buf, sum(contribution(r, 5000, np.float32, ReduceOp.SUM, 99)
                                   for r in range(size)))
    # Pieces: whole tensors packed up to the piece size, larger ones split, all covered.
    assert _plan([3, 2, 6, 1], 4) == [(0, 1, -1, -1, 0), (1, 2, -1, -1, 3),
                                      (2, 3, 0, 4, 5), (2, 3, 4, 6, 9), (3, 4, -1, -1, 11)]
    assert _plan([2, 2, 2], 4) == [(0, 2, -1, -1, 0), (2, 3, -1, -1, 4)]
    backend.close()
    sys.stdout.write(f"OK rank {rank} of {size}: {checked} cases\n")


if __name__ == "__main__":
    try:
        main()
    except BaseException:  # the other ranks would wait in a barrier: end the job now
        import traceback
        traceback.print_exc()
        sys.stdout.flush()
        MPI.COMM_WORLD.Abort(1)

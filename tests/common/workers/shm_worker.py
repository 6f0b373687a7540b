"""The shared-memory allreduce on real ranks, against numpy, with tiny pieces so that
tensors straddle pieces, fill several, and alternate between the two halves."""
from __future__ import annotations


import ml_dtypes
import numpy as np
from mpi4py import MPI

from worker_support import check, close, expect_error, run_checks  # noqa: E402

from horovodish.common.execution.backends.shm import (  # noqa: E402
    SHM_THRESHOLD, SharedMemoryBackend, _plan)
from horovodish.common.messages import ReduceOp, RequestType  # noqa: E402

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


F32 = np.dtype(np.float32)


def window_opens(rank: int, size: int, backend: SharedMemoryBackend) -> None:
    check(backend.available, "the shared-memory window must open on one host")


def every_dtype_op_and_layout(rank: int, size: int, backend: SharedMemoryBackend) -> None:
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
        close(got, expected.astype(np.float64),
              f"{dtype} {op.name} counts {counts} joined {joined} pre {prescale} "
              f"post {postscale} floor {floor_by}")


def fast_and_slow_readers_back_to_back(rank: int, size: int,
                                       backend: SharedMemoryBackend) -> None:
    """Rank 0 copies results out fast (contiguous outputs) and the others slowly (strided
    ones): rank 0 must not overwrite shared data that a slower rank is still reading."""
    for step in range(300):
        counts = [700, 1500, 300] if step % 2 else [2500]
        inputs = [np.full(c, rank * 1000 + step + i, np.float32) for i, c in enumerate(counts)]
        outputs = [np.empty(c, np.float32) if rank == 0 else np.empty((c, 3), np.float32)[:, 1]
                   for c in counts]
        backend.allreduce_into(inputs, counts, outputs, F32, ReduceOp.SUM)
        for i, (c, output) in enumerate(zip(counts, outputs)):
            close(output, np.full(c, sum(r * 1000 + step + i for r in range(size)), np.float32),
                  f"step {step} tensor {i}")


def failed_pack_fails_every_rank(rank: int, size: int, backend: SharedMemoryBackend) -> None:
    """A copy that fails on one rank: the ranks stay in step (no hang), and every rank
    raises (their sums would be wrong)."""
    counts = [1500, 3000]
    good = [np.ones(c, np.float32) for c in counts]
    bad_input = [np.ones(1500, np.float32), np.ones(10, np.float32)]  # too short to pack
    expect_error(lambda: backend.allreduce_into(bad_input if rank == 1 else good, counts,
                                                [np.empty(c, np.float32) for c in counts],
                                                F32, ReduceOp.SUM),
                 (ValueError, RuntimeError),
                 *([] if rank == 1 else ["rank 11 could not copy its input"]),
                 what="rank 1's input too short to pack")


def failed_copy_out_fails_its_rank_only(rank: int, size: int,
                                        backend: SharedMemoryBackend) -> None:
    counts = [1500, 3000]
    good = [np.ones(c, np.float32) for c in counts]
    outputs = [np.empty(c, np.float32) for c in counts]
    if rank == 1:
        outputs[1] = np.empty(7, np.float32)  # too short to receive
        expect_error(lambda: backend.allreduce_into(good, counts, outputs, F32, ReduceOp.SUM),
                     ValueError, what="a copy-out into an output too short")
    else:
        backend.allreduce_into(good, counts, outputs, F32, ReduceOp.SUM)
        for i, output in enumerate(outputs):
            close(output, np.full(counts[i], size, np.float32), f"tensor {i}")
    outputs = [np.empty(c, np.float32) for c in counts]  # and the next call works
    backend.allreduce_into(good, counts, outputs, F32, ReduceOp.SUM)
    for i, output in enumerate(outputs):
        close(output, np.full(counts[i], size, np.float32), f"the next call, tensor {i}")


def in_place_many_tensors_a_piece(rank: int, size: int, backend: SharedMemoryBackend) -> None:
    """Each output is its input: one datatype of the tensors' addresses packs and copies
    out; a strided tensor falls back to the loops."""
    for strided in (False, True):
        counts = [(37 * i) % 113 for i in range(90)]  # some empty, several pieces
        seed = 500 + strided
        tensors = [contribution(rank, c, np.float32, ReduceOp.SUM, seed + i)
                   for i, c in enumerate(counts)]
        if strided:
            tensors[5] = np.repeat(tensors[5], 2)[::2]
        backend.allreduce_into(tensors, counts, tensors, F32, ReduceOp.SUM, in_place=True)
        for i, (tensor, c) in enumerate(zip(tensors, counts)):
            expected = sum(contribution(r, c, np.float32, ReduceOp.SUM, seed + i)
                           for r in range(size))
            close(tensor, expected, f"strided {strided}, tensor {i}")


def failed_describe_fails_every_rank(rank: int, size: int,
                                     backend: SharedMemoryBackend) -> None:
    """Describing the tensors fails on rank 1 only: a failed pack like any other (every
    rank raises, no rank skips a barrier), and the next call works."""
    counts = [40] * 40
    tensors = [np.ones(c, np.float32) for c in counts]
    if rank == 1:
        backend._copier.describe = lambda *args, **kwargs: (_ for _ in ()).throw(
            MemoryError("no datatype"))
    expect_error(lambda: backend.allreduce_into(tensors, counts, tensors, F32, ReduceOp.SUM,
                                                in_place=True),
                 (MemoryError, RuntimeError),
                 *([] if rank == 1 else ["rank 11 could not copy its input"]),
                 what="a describe failing on rank 1")
    if rank == 1:
        del backend._copier.describe  # the class's method again
    tensors = [np.ones(c, np.float32) for c in counts]
    backend.allreduce_into(tensors, counts, tensors, F32, ReduceOp.SUM, in_place=True)
    for i, tensor in enumerate(tensors):
        close(tensor, np.full(40, size, np.float32), f"the next call, tensor {i}")


def in_place_through_the_backend_interface(rank: int, size: int,
                                           backend: SharedMemoryBackend) -> None:
    buf = contribution(rank, 5000, np.float32, ReduceOp.SUM, 99)  # several pieces
    backend.allreduce(buf, ReduceOp.SUM)
    close(buf, sum(contribution(r, 5000, np.float32, ReduceOp.SUM, 99) for r in range(size)),
          "5000 values in place")


def chosen_from_the_threshold_for_groups_and_single_tensors(
        rank: int, size: int, backend: SharedMemoryBackend) -> None:
    """By default (no CPU_OPERATIONS): single tensors too, since they gained from 64 KiB
    on, up to the ring's threshold (docs/tuning.md); smaller ones, and other
    collectives, go to MPI or the ring."""
    default = SharedMemoryBackend(MPI.COMM_WORLD, None, single_below=1 << 20)
    try:
        check(not default.enabled(RequestType.ALLREDUCE, "float32", 1 << 20, 1),
              "a single tensor of the ring's threshold: the ring's")
        check(default.enabled(RequestType.ALLREDUCE, "float32", 1 << 20, 2),
              "a group of the ring's threshold: shared memory")
        for tensors in (1, 2):
            check(default.enabled(RequestType.ALLREDUCE, "float32", SHM_THRESHOLD, tensors),
                  f"{tensors} tensor(s) of {SHM_THRESHOLD} bytes: shared memory")
            check(not default.enabled(RequestType.ALLREDUCE, "float32", SHM_THRESHOLD - 4,
                                      tensors),
                  f"{tensors} tensor(s) below {SHM_THRESHOLD} bytes: not shared memory")
        check(not default.enabled(RequestType.ALLGATHER, "float32", 1 << 20, 1),
              "an allgather: not shared memory")
        check(not any(default.enabled(RequestType.BROADCAST, "float32", nbytes, 1)
                      for nbytes in (SHM_THRESHOLD, 1 << 20, 64 << 20)),
              "a broadcast: not shared memory (MPI's single copy is faster)")
    finally:
        default.close()


def pieces(rank: int, size: int, backend: SharedMemoryBackend) -> None:
    """Whole tensors packed up to the piece size, larger ones split, all covered."""
    check(_plan([3, 2, 6, 1], 4) == [(0, 1, -1, -1, 0), (1, 2, -1, -1, 3), (2, 3, 0, 4, 5),
                                     (2, 3, 4, 6, 9), (3, 4, -1, -1, 11)],
          f"_plan([3, 2, 6, 1], 4) = {_plan([3, 2, 6, 1], 4)}")
    check(_plan([2, 2, 2], 4) == [(0, 2, -1, -1, 0), (2, 3, -1, -1, 4)],
          f"_plan([2, 2, 2], 4) = {_plan([2, 2, 2], 4)}")


CHECKS = [window_opens, every_dtype_op_and_layout, fast_and_slow_readers_back_to_back,
          failed_pack_fails_every_rank, failed_copy_out_fails_its_rank_only,
          in_place_many_tensors_a_piece, failed_describe_fails_every_rank,
          in_place_through_the_backend_interface,
          chosen_from_the_threshold_for_groups_and_single_tensors, pieces]

if __name__ == "__main__":
    comm = MPI.COMM_WORLD.Dup()
    # As a process set's would be: messages name rank r as world rank r + 10.
    shm = SharedMemoryBackend(comm, "shm", piece_bytes=PIECE_BYTES,
                              world_ranks=[r + 10 for r in range(comm.Get_size())])
    run_checks(CHECKS, comm.Get_rank(), comm.Get_size(), shm)
    shm.close()

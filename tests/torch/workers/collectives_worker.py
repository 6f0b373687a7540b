"""Every torch collective x dtype x shape against numpy, on every rank.

Each rank's input is a pure function of (rank, name), so every rank can compute every
other rank's input and hence the exact reference. Each collective is a named check
(tests/worker_support.py): a failure is reported and the next check still runs.
"""
from __future__ import annotations

import os
import zlib

import numpy as np
import torch

from worker_support import check, close, expect_error, run_checks  # noqa: E402

import horovodish.torch as hvd  # noqa: E402
from horovodish.common.api import collectives as core  # noqa: E402
from torch_staging import staging_checks  # noqa: E402

DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64, torch.bool]
SHAPES = [(), (0,), (5,), (3, 4), (2, 0, 3), (17, 3)]


def toward_zero(total: np.ndarray, size: int) -> np.ndarray:
    """Integer Average as Horovod computes it: the quotient truncated toward zero."""
    return np.sign(total) * (np.abs(total) // size)


def data(rank: int, name: str, shape, dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(zlib.crc32(f"{name}/{rank}".encode()))
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    if dtype.is_floating_point:
        # Small integers: sums are exact in every float type, so references match exactly.
        return torch.randint(-4, 5, shape, generator=gen).to(dtype)
    low = 0 if dtype == torch.uint8 else -3
    return torch.randint(low, 4, shape, generator=gen).to(dtype)


def ref_np(t: torch.Tensor) -> np.ndarray:
    return t.to(torch.float64).numpy() if t.dtype in (torch.bfloat16, torch.float16) else t.numpy()


TOLERANCE = {torch.float16: 1e-2, torch.bfloat16: 2e-2, torch.float32: 1e-6, torch.float64: 1e-12}


def same(got: torch.Tensor, want: np.ndarray, what: str) -> None:
    """Exact for integers and bool; within the dtype's rounding for floats (Average divides)."""
    close(ref_np(got), want, what, TOLERANCE.get(got.dtype, 0.0))


def allreduce_reference(inputs, op, pre, post, dtype, size):
    arrays = [ref_np(t) for t in inputs]
    if dtype == torch.bool:
        stacked = np.stack(arrays)
        return {hvd.Sum: stacked.any(0), hvd.Max: stacked.any(0), hvd.Min: stacked.all(0),
                hvd.Product: stacked.all(0)}[op]
    if dtype.is_floating_point:
        arrays = [a * pre for a in arrays]
    stacked = np.stack(arrays)
    if op in (hvd.Sum, hvd.Average):
        result = stacked.sum(0)
        if op == hvd.Average:
            result = result / size if dtype.is_floating_point else toward_zero(result, size)
    elif op == hvd.Min:
        result = stacked.min(0)
    elif op == hvd.Max:
        result = stacked.max(0)
    else:
        result = stacked.prod(0)
    return result * post if dtype.is_floating_point else result


def allreduce(rank: int, size: int) -> None:
    ops = [hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product]
    for dtype in DTYPES:
        for shape in SHAPES:
            for op in ops:
                if dtype == torch.bool and op == hvd.Average:
                    continue
                scales = [(1.0, 1.0)]
                if dtype.is_floating_point and op in (hvd.Sum, hvd.Average):
                    scales.append((0.5, 4.0))
                for pre, post in scales:
                    name = f"ar.{dtype}.{shape}.{op}.{pre}"
                    inputs = [data(r, name, shape, dtype) for r in range(size)]
                    want = allreduce_reference(inputs, op, pre, post, dtype, size)
                    got = hvd.allreduce(inputs[rank], name=name, op=op, prescale_factor=pre,
                                        postscale_factor=post)
                    same(got, want, name)
                    check(got.dtype == dtype, f"{name}: dtype {got.dtype}")
                    mine = inputs[rank].clone()
                    hvd.allreduce_(mine, name=name + ".inplace", op=op, prescale_factor=pre,
                                   postscale_factor=post)
                    same(mine, want, name + " in place")
    # Integer Average with a postscale: trunc(sum * postscale / size), as Horovod (not
    # the quotient times the postscale); reducescatter alike.
    for dtype in (torch.int32, torch.int64, torch.int8):
        inputs = [data(r, f"int.post.{dtype}", (2 * size + 1,), dtype) for r in range(size)]
        total = np.stack([ref_np(t) for t in inputs]).astype(np.int64).sum(0)
        want = np.trunc(total * 3.0 / size)
        same(hvd.allreduce(inputs[rank], name=f"int.post.{dtype}", op=hvd.Average,
                           postscale_factor=3.0), want, f"{dtype} Average, postscale 3")
        rows = [len(want) // size + (1 if r < len(want) % size else 0) for r in range(size)]
        mine = want[sum(rows[:rank]):sum(rows[:rank + 1])]
        same(hvd.reducescatter(inputs[rank], name=f"int.post.rs.{dtype}", op=hvd.Average,
                               postscale_factor=3.0), mine, f"{dtype} reducescatter, postscale 3")
        same(hvd.reducescatter(inputs[rank], name=f"int.rs.{dtype}", op=hvd.Average),
             toward_zero(total, size)[sum(rows[:rank]):sum(rows[:rank + 1])],
             f"{dtype} reducescatter Average")
    # Non-contiguous input, in place and not.
    base = data(rank, "nc", (4, 6), torch.float32)
    view = base.t()
    want = sum(ref_np(data(r, "nc", (4, 6), torch.float32)).T for r in range(size))
    same(hvd.allreduce(view, name="nc", op=hvd.Sum), want, "non-contiguous allreduce")
    hvd.allreduce_(view, name="nc.inplace", op=hvd.Sum)
    same(view, want, "non-contiguous allreduce_")
    # Grouped, with the deprecated average= flag.
    tensors = [data(rank, f"g{i}", (i + 1, 2), torch.float32) for i in range(4)]
    outs = hvd.grouped_allreduce(tensors, name="grouped", average=False)
    for i, out in enumerate(outs):
        same(out, sum(ref_np(data(r, f"g{i}", (i + 1, 2), torch.float32)) for r in range(size)),
             f"grouped {i}")


def allgather(rank: int, size: int) -> None:
    for dtype in DTYPES:
        for trailing in [(), (3,), (2, 0)]:
            name = f"ag.{dtype}.{trailing}"
            # Uneven first dims; rank 1 sends zero rows.
            rows = [0 if r == 1 else r + 2 for r in range(size)]
            inputs = [data(r, name, (rows[r],) + trailing, dtype) for r in range(size)]
            got = hvd.allgather(inputs[rank], name=name)
            same(got, np.concatenate([ref_np(t) for t in inputs]), name)
    outs = hvd.grouped_allgather([torch.full((rank + 1,), rank), torch.ones(2, 2) * rank],
                                 name="gag")
    same(outs[0], np.concatenate([np.full(r + 1, r) for r in range(size)]), "grouped allgather 0")
    same(outs[1], np.concatenate([np.ones((2, 2)) * r for r in range(size)]), "grouped allgather 1")


def broadcast(rank: int, size: int) -> None:
    for dtype in DTYPES:
        for shape in SHAPES:
            for root in range(size):
                name = f"bc.{dtype}.{shape}.{root}"
                inputs = [data(r, name, shape, dtype) for r in range(size)]
                same(hvd.broadcast(inputs[rank], root, name=name), ref_np(inputs[root]), name)
                mine = inputs[rank].clone()
                hvd.broadcast_(mine, root, name=name + ".inplace")
                same(mine, ref_np(inputs[root]), name + " in place")


def alltoall(rank: int, size: int) -> None:
    for dtype in [torch.float32, torch.int64, torch.bfloat16, torch.bool]:
        name = f"a2a.even.{dtype}"
        inputs = [data(r, name, (2 * size, 3), dtype) for r in range(size)]
        got = hvd.alltoall(inputs[rank], name=name)
        want = np.concatenate([ref_np(inputs[src])[2 * rank:2 * rank + 2] for src in range(size)])
        same(got, want, name)
    # Uneven splits: rank r sends (r + dest) % 3 rows to dest.
    splits = [[(r + d) % 3 for d in range(size)] for r in range(size)]
    inputs = [data(r, "a2a.splits", (sum(splits[r]), 2), torch.float32) for r in range(size)]
    got, received = hvd.alltoall(inputs[rank], splits=splits[rank], name="a2a.splits")
    parts = []
    for src in range(size):
        start = sum(splits[src][:rank])
        parts.append(ref_np(inputs[src])[start:start + splits[src][rank]])
    same(got, np.concatenate(parts), "alltoall splits")
    check(received.tolist() == [splits[src][rank] for src in range(size)],
          f"received splits {received.tolist()}")


def reducescatter(rank: int, size: int) -> None:
    for dtype in [torch.float32, torch.float64, torch.int32, torch.float16, torch.bfloat16]:
        for rows in [size * 2, size * 2 + 1, 1]:  # divisible and not
            for op in [hvd.Sum, hvd.Average, hvd.Max]:
                name = f"rs.{dtype}.{rows}.{op}"
                inputs = [data(r, name, (rows, 3), dtype) for r in range(size)]
                full = allreduce_reference(inputs, op, 1.0, 1.0, dtype, size)
                base, extra = divmod(rows, size)
                start = rank * base + min(rank, extra)
                count = base + (1 if rank < extra else 0)
                same(hvd.reducescatter(inputs[rank], name=name, op=op),
                     full[start:start + count], name)
    outs = hvd.grouped_reducescatter([torch.ones(size, 2), torch.ones(size * 3)], op=hvd.Sum)
    same(outs[0], np.full((1, 2), size), "grouped reducescatter 0")
    same(outs[1], np.full((3,), size), "grouped reducescatter 1")


def runtime_owned_results(rank: int, size: int) -> None:
    """Results in runtime-owned blocks (what DistributedOptimizer uses): every dtype, shape
    and op against numpy; fused with a caller-owned output in the same cycle; a result
    still referenced is never overwritten, and a dropped one's block is reused."""
    from horovodish.torch import mpi_ops
    for dtype in DTYPES:
        for op in [hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product]:
            if dtype == torch.bool and op == hvd.Average:
                continue
            pre, post = (1.0, 1.0)
            if dtype.is_floating_point:  # a negative postscale swaps Min and Max
                pre, post = (0.5, 4.0) if op in (hvd.Sum, hvd.Average) else (0.5, -2.0)
            names = [f"own.{dtype}.{op}.{shape}" for shape in SHAPES]
            inputs = [[data(r, n, shape, dtype) for n, shape in zip(names, SHAPES)]
                      for r in range(size)]
            mixed_name = f"own.{dtype}.{op}.caller"
            mixed_in = [data(r, mixed_name, (6,), dtype) for r in range(size)]
            owned = mpi_ops.grouped_allreduce_into_runtime_async(
                inputs[rank], name=names, op=op, prescale_factor=pre, postscale_factor=post)
            caller = hvd.allreduce_async(mixed_in[rank], name=mixed_name, op=op,
                                         prescale_factor=pre, postscale_factor=post)
            got = mpi_ops.synchronize(owned)
            for i, (name, shape) in enumerate(zip(names, SHAPES)):
                want = allreduce_reference([inputs[r][i] for r in range(size)], op, pre, post,
                                           dtype, size)
                same(got[i], want, name)
                check(got[i].dtype == dtype, f"{name}: dtype {got[i].dtype}")
            same(hvd.synchronize(caller), allreduce_reference(mixed_in, op, pre, post, dtype,
                                                              size), mixed_name)
    # Ranks may mix the two APIs under one name: every rank must contribute alike.
    for dtype in (torch.float32, torch.float64, torch.float16, torch.int32):
        for op in (hvd.Average, hvd.Sum, hvd.Product, hvd.Max):
            name = f"own.mixed.{dtype}.{op}"
            inputs = [data(r, name, (7,), dtype) for r in range(size)]
            pre, post = (0.5, 3.0) if dtype.is_floating_point else (1.0, 1.0)
            if rank % 2 == 0:
                got = mpi_ops.synchronize(mpi_ops.grouped_allreduce_into_runtime_async(
                    [inputs[rank]], name=[name], op=op, prescale_factor=pre,
                    postscale_factor=post))[0]
            else:
                got = hvd.allreduce(inputs[rank], name=name, op=op, prescale_factor=pre,
                                    postscale_factor=post)
            same(got, allreduce_reference(inputs, op, pre, post, dtype, size), name)
    # ... also in a fused group large enough to go in pieces (~3 MiB): the pieces, and so
    # the collectives, must not depend on which API a rank used.
    names = [f"own.big.{i}" for i in range(24)]
    inputs = [[data(r, n, (32768,), torch.float32) for n in names] for r in range(size)]
    if rank % 2 == 0:
        got = mpi_ops.synchronize(mpi_ops.grouped_allreduce_into_runtime_async(
            inputs[rank], name=names, op=hvd.Sum))
    else:
        got = hvd.grouped_allreduce(inputs[rank], name=names, op=hvd.Sum)
    for i, name in enumerate(names):
        same(got[i], allreduce_reference([inputs[r][i] for r in range(size)], hvd.Sum, 1.0,
                                         1.0, torch.float32, size), name)
    first = mpi_ops.synchronize(mpi_ops.grouped_allreduce_into_runtime_async(
        [torch.full((1000,), float(rank))], name=["own.keep"], op=hvd.Sum))[0]
    second = mpi_ops.synchronize(mpi_ops.grouped_allreduce_into_runtime_async(
        [torch.full((1000,), 1.0)], name=["own.keep"], op=hvd.Sum))[0]
    total = float(sum(range(size)))
    check(bool((first == total).all()) and bool((second == size).all()),
          f"a live result was overwritten: {first[:3]} {second[:3]}")
    pointer = second.data_ptr()
    del second
    third = mpi_ops.synchronize(mpi_ops.grouped_allreduce_into_runtime_async(
        [torch.full((1000,), 2.0)], name=["own.keep"], op=hvd.Sum))[0]
    reused = third.data_ptr() == pointer or bool(os.environ.get("STAGE_THROUGH_HOST"))
    check(reused and bool((third == 2.0 * size).all()),  # (staged results are copies)
          "a dropped result's block was not reused")
    # The same for out-of-place hvd.allreduce of one tensor, whose result is a whole
    # block when it fits one exactly: a fresh array (4 KB), shared memory (256 KiB), the
    # ring (4 MiB), each held across a second call of its name.
    for count in (1000, 1 << 16, 1 << 20):
        name = f"own.single.{count}"
        first = hvd.allreduce(torch.full((count,), float(rank)), name=name, op=hvd.Sum)
        second = hvd.allreduce(torch.full((count,), 1.0), name=name, op=hvd.Sum)
        check(bool((first == total).all()) and bool((second == size).all()),
              f"{name}: a live result was overwritten: {first[:3]} {second[:3]}")
        pointer = second.data_ptr()
        del second
        third = hvd.allreduce(torch.full((count,), 2.0), name=name, op=hvd.Sum)
        check(bool((third == 2.0 * size).all()) and bool((first == total).all()),
              f"{name}: {third[:3]} {first[:3]}")
        check(count == 1000 or third.data_ptr() == pointer or
              bool(os.environ.get("STAGE_THROUGH_HOST")),
              f"{name}: a dropped result's block was not reused")


def large_tensors_in_a_group(rank: int, size: int) -> None:
    """A group of small tensors and tensors large enough to leave it (from 4 MiB a tensor
    goes to the ring alone, and on one host a group goes to shared memory): out of place,
    in place and into runtime-owned blocks, float32 Average with scaling and int32
    Average, each tensor against numpy. Results in the wrong order, a run skipped or
    reduced twice all show here."""
    from horovodish.torch import mpi_ops
    shapes = [(1000,), (1_500_000,), (3, 1000), (5,), (1_200_000,), (1_100_000,), (77,)]
    for dtype, op, pre, post in ((torch.float32, hvd.Average, 0.5, 3.0),
                                 (torch.int32, hvd.Average, 1.0, 1.0)):
        names = [f"big.group.{dtype}.{i}" for i in range(len(shapes))]
        inputs = [[data(r, n, shape, dtype) for n, shape in zip(names, shapes)]
                  for r in range(size)]
        wants = [allreduce_reference([inputs[r][i] for r in range(size)], op, pre, post,
                                     dtype, size) for i in range(len(shapes))]
        out = hvd.grouped_allreduce(inputs[rank], name=f"big.group.{dtype}", op=op,
                                    prescale_factor=pre, postscale_factor=post)
        mine = [t.clone() for t in inputs[rank]]
        hvd.grouped_allreduce_(mine, name=f"big.group.{dtype}.inplace", op=op,
                               prescale_factor=pre, postscale_factor=post)
        owned = mpi_ops.synchronize(mpi_ops.grouped_allreduce_into_runtime_async(
            inputs[rank], name=[n + ".owned" for n in names], op=op, prescale_factor=pre,
            postscale_factor=post))
        for i, want in enumerate(wants):
            same(out[i], want, f"{names[i]} out of place")
            same(mine[i], want, f"{names[i]} in place")
            same(owned[i], want, f"{names[i]} runtime-owned")
            check(tuple(out[i].shape) == shapes[i], f"{names[i]}: shape {tuple(out[i].shape)}")


def held_results_of_every_collective(rank: int, size: int) -> None:
    """Out-of-place results of broadcast, allgather, reducescatter and alltoall come from
    memory the runtime reuses: a result the caller still holds is never written by a
    later call of the same size, and a dropped one's memory serves the next call (from
    1 MiB: a fresh result would fault its pages in every call). Sizes: a small array,
    one past the prefault size, and 4 MiB, each checked against numpy on every rank."""
    rows_per_rank = [256, 1 << 16 | 8, 1 << 20]

    def inputs(tag: str, count: int) -> list[torch.Tensor]:
        return [data(r, f"held.{tag}.{count}", (count,), torch.float32) for r in range(size)]

    def calls(count: int):
        rows = count // size * size
        split = [rows // size] * size
        return {
            "broadcast": (lambda t, n: hvd.broadcast(t, size - 1, name=n),
                          lambda ins: ref_np(ins[size - 1])),
            "allgather": (lambda t, n: hvd.allgather(t, name=n),
                          lambda ins: np.concatenate([ref_np(t) for t in ins])),
            "reducescatter": (lambda t, n: hvd.reducescatter(t[:rows], op=hvd.Sum, name=n),
                              lambda ins: sum(ref_np(t[:rows]) for t in ins)[
                                  rank * split[0]:(rank + 1) * split[0]]),
            "alltoall": (lambda t, n: hvd.alltoall(t[:rows], name=n),
                         lambda ins: np.concatenate([ref_np(t[:rows])[
                             rank * split[0]:(rank + 1) * split[0]] for t in ins])),
        }

    for count in rows_per_rank:
        for op, (call, want) in calls(count).items():
            name = f"held.{op}.{count}"
            first_in, second_in, third_in = (inputs(tag, count) for tag in "abc")
            first = call(first_in[rank], name)
            second = call(second_in[rank], name)
            same(first, want(first_in), f"{name}: the first result, held across a call")
            same(second, want(second_in), f"{name}: the second result")
            pointer = second.data_ptr()
            del second
            third = call(third_in[rank], name)
            same(third, want(third_in), f"{name}: the third result")
            same(first, want(first_in), f"{name}: the first result, held across two calls")
            check(count < 1 << 20 or third.data_ptr() == pointer or
                  bool(os.environ.get("STAGE_THROUGH_HOST")),
                  f"{name}: a dropped result's memory did not serve the next call")


def out_of_order_and_burst(rank: int, size: int) -> None:
    names = [f"ooo.{i}" for i in range(40)]
    order = names if rank % 2 == 0 else list(reversed(names))
    handles = {n: hvd.allreduce_async(torch.full((i % 7 + 1,), float(rank + i)), name=n,
                                      op=hvd.Sum)
               for i, n in ((names.index(n), n) for n in order)}
    for i, n in enumerate(names):
        same(hvd.synchronize(handles[n]), np.full(i % 7 + 1, sum(r + i for r in range(size)),
                                                    dtype=np.float64), n)
    # Every third tensor 16 KiB, so that the fused group (~3 MiB) goes in pieces; every
    # other one in place (results copied back into the callers' tensors).
    def burst_tensor(i: int) -> torch.Tensor:
        return torch.full((4096 if i % 3 == 0 else 16,), float(rank * i))

    for step in range(2):  # twice: the second burst runs from the response cache
        handles = [(hvd.allreduce_async_ if i % 2 else hvd.allreduce_async)(
            burst_tensor(i), name=f"burst.{i}", op=hvd.Sum) for i in range(600)]
        for i, h in enumerate(handles):
            same(hvd.synchronize(h), np.full(4096 if i % 3 == 0 else 16,
                                             sum(r * i for r in range(size)),
                                             dtype=np.float64), f"burst {i}")


def unnamed_calls(rank: int, size: int) -> None:
    """Synchronous unnamed calls (a fresh name each): where every rank's cycle brings the
    same one, each rank answers it without the coordinator (unanimous cycles); results
    against numpy either way, and a mismatch after them still named on every rank."""
    from horovodish.common.api import process_state
    runtime = process_state.state().runtime
    controller = runtime.controller
    before, speculated = controller.unanimous_cycles, controller.speculated_cycles
    for i in range(20):
        same(hvd.allreduce(torch.full((5,), float(rank + i)), op=hvd.Sum),
             np.full(5, sum(r + i for r in range(size)), np.float64), f"unnamed allreduce {i}")
        same(hvd.broadcast(torch.full((3,), float(10 * rank + i)), size - 1),
             np.full(3, float(10 * (size - 1) + i)), f"unnamed broadcast {i}")
        same(hvd.reducescatter(torch.full((2 * size, 2), float(rank + 1)), op=hvd.Sum),
             np.full((2, 2), float(sum(r + 1 for r in range(size)))),
             f"unnamed reducescatter {i}")
    check(controller.unanimous_cycles > before,
          f"no unanimous cycle in 60 unnamed calls ({controller.slow_cycles} slow cycles)")
    if runtime.eager is not None and controller.transport.one_host:  # data too
        check(controller.speculated_cycles > speculated,
              "no unnamed allreduce brought its data with its negotiation")
    if size > 1:
        kind = torch.float64 if rank == 1 else torch.float32
        expect_error(lambda: hvd.allreduce(torch.ones(2, dtype=kind)),
                     hvd.HorovodInternalError, "allreduce of tensor 'allreduce.noname.",
                     "dtype", "float32", "float64")
    same(hvd.allreduce(torch.ones(2), op=hvd.Sum), np.full(2, float(size)), "unnamed after")


def join_and_barrier(rank: int, size: int) -> None:
    hvd.barrier()
    steps = 3 + rank  # uneven: rank r does 3 + r steps
    from horovodish.torch import mpi_ops
    for step in range(steps):
        got = hvd.allreduce(torch.ones(4) * (rank + 1), name="join.step", op=hvd.Average)
        active = [r for r in range(size) if step < 3 + r]
        same(got, np.full(4, sum(r + 1 for r in active) / size), f"join step {step}")
        # Runtime-owned results (DistributedOptimizer's path) with joined ranks too.
        owned = mpi_ops.synchronize(mpi_ops.grouped_allreduce_into_runtime_async(
            [torch.ones(3) * (rank + 1), torch.ones(2, 2)], name=["join.a", "join.b"],
            op=hvd.Average))
        same(owned[0], np.full(3, sum(r + 1 for r in active) / size), f"join owned {step}")
        same(owned[1], np.full((2, 2), len(active) / size), f"join owned b {step}")
        # A single tensor from the ring's threshold on (4 MiB): the ring's path.
        big = hvd.allreduce(torch.full((1 << 20,), float(rank + 1)), name="join.big",
                            op=hvd.Average)
        same(big, np.full(1 << 20, sum(r + 1 for r in active) / size), f"join big {step}")
    last = hvd.join()
    check(last == size - 1, f"join returned {last}, expected {size - 1}")
    hvd.barrier()


def errors(rank: int, size: int) -> None:
    if size > 1:
        other = rank == 1
        expect_error(lambda: hvd.allreduce(torch.ones(3, dtype=torch.float64 if other else
                                                      torch.float32), name="mm.dtype"),
                     hvd.HorovodInternalError, "mm.dtype", "allreduce", "float32", "float64")
        expect_error(lambda: hvd.allreduce(torch.ones(3 if other else 2), name="mm.shape"),
                     hvd.HorovodInternalError, "mm.shape", "(2,)", "(3,)")
        expect_error(lambda: hvd.allreduce(torch.ones(2), name="mm.op",
                                           op=hvd.Max if other else hvd.Sum),
                     hvd.HorovodInternalError, "mm.op", "reduce op", "Max", "Sum")
        expect_error(lambda: hvd.allreduce(torch.ones(2), name="mm.scale",
                                           prescale_factor=2.0 if other else 1.0),
                     hvd.HorovodInternalError, "mm.scale", "prescale")
        expect_error(lambda: hvd.broadcast(torch.ones(2), 1 if other else 0, name="mm.root"),
                     hvd.HorovodInternalError, "mm.root", "root rank")
        expect_error(lambda: hvd.alltoall(torch.ones(size), name="mm.splits",
                                          splits=[1] * size if other else None),
                     hvd.HorovodInternalError, "mm.splits", "splits")
        # A dtype that differs, for every collective, unnamed too (Horovod's type-error
        # tests): every rank raises, naming the tensor, the op and both dtypes.
        kind = torch.float32 if other else torch.int32
        for opname, call in [
                ("allgather", lambda: hvd.allgather(torch.ones(2, 3, dtype=kind))),
                ("broadcast", lambda: hvd.broadcast(torch.ones(3, dtype=kind), 0)),
                ("alltoall", lambda: hvd.alltoall(torch.ones(size, dtype=kind))),
                ("reducescatter", lambda: hvd.reducescatter(torch.ones(size, 3, dtype=kind))),
                ("reducescatter", lambda: hvd.grouped_reducescatter(
                    [torch.ones(size, dtype=kind)]))]:
            expect_error(call, hvd.HorovodInternalError, f"{opname} of tensor '{opname}.noname.",
                         "dtype", "int32", "float32")
        # A cached name whose shape changes on one rank: invalidated, then reported.
        hvd.allreduce(torch.ones(2), name="mm.cached")
        expect_error(lambda: hvd.allreduce(torch.ones(3 if other else 2), name="mm.cached"),
                     hvd.HorovodInternalError, "mm.cached", "shape")
        # The runtime keeps working.
        same(hvd.allreduce(torch.ones(2), name="mm.after", op=hvd.Sum), np.full(2, size),
             "after mismatch")
    expect_error(lambda: hvd.allreduce(torch.ones(2, dtype=torch.bool), op=hvd.Average),
                 TypeError, "Average", "bool")
    expect_error(lambda: hvd.broadcast(torch.ones(2), size), ValueError, "root_rank", "range")
    expect_error(lambda: hvd.alltoall(torch.ones(3), splits=[1] * (size + 1)), ValueError,
                 "splits")
    expect_error(lambda: hvd.alltoall(torch.ones(3), splits=[4] + [0] * (size - 1)),
                 ValueError, "sum")
    # A refused call keeps the automatic name it took: where only some ranks refuse it,
    # the others' call then stalls under its own name (and is reported) instead of
    # pairing with this rank's next unnamed call (a silent mix-up of two calls' data).
    before = int(core.auto_name("alltoall").rsplit(".", 1)[1])
    expect_error(lambda: hvd.alltoall(torch.ones(3), splits=[1] * (size + 1)), ValueError,
                 "splits")
    check(core.auto_name("alltoall") == f"alltoall.noname.{before + 2}",
          "a refused alltoall gave its name back")
    same(hvd.alltoall(torch.arange(float(size)) + 10 * rank),
         np.array([10.0 * src + rank for src in range(size)]), "unnamed alltoall after a refusal")
    held = hvd.allreduce_async(torch.ones(1), name="in.flight")
    expect_error(lambda: hvd.allreduce_async(torch.ones(1), name="in.flight"), ValueError,
                 "allreduce.in.flight", "in flight")
    # Different collectives may share a name, as in Horovod (its torch names are
    # "<op>.<name>"), and be in flight together (waited on in either order).
    gathered = hvd.allgather_async(torch.full((1,), float(rank)), name="in.flight")
    if rank % 2:
        same(hvd.synchronize(gathered), np.arange(float(size)), "allgather sharing a name")
        same(hvd.synchronize(held), np.full(1, 1.0), "allreduce sharing a name")
    else:
        same(hvd.synchronize(held), np.full(1, 1.0), "allreduce sharing a name")
        same(hvd.synchronize(gathered), np.arange(float(size)), "allgather sharing a name")


def sparse(rank: int, size: int) -> None:
    """Sparse allreduce equals the dense allreduce of the same tensors."""
    def sparse_of(r: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(r)
        rows = torch.randint(0, 10, (4 + r,), generator=gen)
        return torch.sparse_coo_tensor(rows.unsqueeze(0), torch.randn(4 + r, 3, generator=gen),
                                       (10, 3), check_invariants=True)
    for op in (hvd.Sum, hvd.Average):
        got = hvd.sparse_allreduce(sparse_of(rank), name=f"sparse.{op}", op=op)
        check(got.is_sparse, "sparse result")
        want = sum(sparse_of(r).to_dense() for r in range(size)).numpy()
        if op == hvd.Average:
            want = want / size
        same(got.to_dense(), want, f"sparse allreduce {op}")
        # The async handle is Horovod's callable (handle() gives the result), and an
        # integer handle that synchronize and poll take as well.
        called = hvd.sparse_allreduce_async(sparse_of(rank), name=f"sparse.call.{op}", op=op)
        check(callable(called), "sparse_allreduce_async handle is not callable")
        got = called()
        check(got.is_sparse, "sparse result through handle()")
        same(got.to_dense(), want, f"sparse allreduce handle() {op}")
        waited = hvd.sparse_allreduce_async(sparse_of(rank), name=f"sparse.sync.{op}", op=op)
        while not hvd.poll(waited):
            pass
        same(hvd.synchronize(waited).to_dense(), want, f"sparse allreduce synchronize {op}")
    expect_error(lambda: hvd.sparse_allreduce(sparse_of(rank), op=hvd.Max), ValueError, "Max")


def process_sets(rank: int, size: int) -> None:
    """A set that excludes rank 1, while rank 1 runs collectives of its own set."""
    evens = hvd.add_process_set([r for r in range(size) if r % 2 == 0])
    odds = hvd.add_process_set([r for r in range(size) if r % 2 == 1])
    mine = evens if rank % 2 == 0 else odds
    members = mine.ranks
    x = torch.full((3,), float(rank))
    same(hvd.allreduce(x, op=hvd.Sum, process_set=mine), np.full(3, sum(members), np.float64),
         "process set allreduce")
    same(hvd.allgather(x[:1], process_set=mine), np.array(members, np.float64),
         "process set allgather")
    same(hvd.broadcast(x, members[-1], process_set=mine), np.full(3, members[-1], np.float64),
         "process set broadcast")
    same(hvd.reducescatter(torch.ones(len(members), 2), op=hvd.Sum, process_set=mine),
         np.full((1, 2), len(members), np.float64), "process set reducescatter")
    check(hvd.allgather_object(rank, process_set=mine) == members, "allgather_object on a set")
    hvd.barrier(process_set=mine)
    other = odds if mine is evens else evens
    expect_error(lambda: hvd.allreduce(x, process_set=other), ValueError, "not a member")
    hvd.remove_process_set(odds)
    hvd.remove_process_set(evens)


def optimizer_steps(rank: int, size: int) -> None:
    """DistributedOptimizer, three steps against SGD on the mean of every rank's
    gradients, computed here from every rank's data. The parameters average over 256 KiB,
    so on the host they stay per tensor (flat_buckets.HOST_MEAN_BYTES), and each gradient
    autograd made is reduced where it lies (no copy into a runtime block)."""
    def model() -> torch.nn.Module:
        torch.manual_seed(3)
        return torch.nn.Sequential(torch.nn.Linear(600, 500), torch.nn.Tanh(),
                                   torch.nn.Linear(500, 4))
    ours, reference = model(), model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(ours.parameters(), lr=0.1),
                                   named_parameters=ours.named_parameters())
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for step in range(3):
        def batch(r: int) -> torch.Tensor:
            return torch.from_numpy(np.random.default_rng(step * 10 + r).standard_normal(
                (8, 600)).astype(np.float32))
        opt.zero_grad()
        ours(batch(rank)).square().mean().backward()
        autograd_made = {n: p.grad.data_ptr() for n, p in ours.named_parameters()}
        opt.step()
        ref_opt.zero_grad()
        (sum(reference(batch(r)).square().mean() for r in range(size)) / size).backward()
        ref_opt.step()
        for (name, got), want in zip(ours.named_parameters(), reference.parameters()):
            close(got.detach().numpy(), want.detach().numpy(), f"step {step}: {name}",
                  1e-5, 1e-6)
        moved = [n for n, p in ours.named_parameters() if p.grad.data_ptr() != autograd_made[n]]
        check(not moved, f"step {step}: gradients copied elsewhere: {moved}")


def topology(rank: int, size: int) -> None:
    check(0 <= hvd.local_rank() < hvd.local_size() and hvd.cross_size() >= 1,
          f"local rank {hvd.local_rank()} of {hvd.local_size()}, cross size {hvd.cross_size()}")


def shutdown_with_work_in_flight(rank: int, size: int) -> None:
    """Rank 0 leaves a tensor pending that rank 1 never submits, then shuts down."""
    if rank == 0:
        handle = hvd.allreduce_async(torch.ones(1), name="never.matched")
    hvd.barrier()  # rank 0 has submitted before anyone shuts down
    hvd.shutdown()
    if rank == 0:
        expect_error(lambda: hvd.synchronize(handle), hvd.HorovodInternalError,
                     "never.matched", "shut down", what="the pending tensor after shutdown()")


if __name__ == "__main__":
    checks = [topology, allreduce, allgather, broadcast, alltoall, reducescatter,
              runtime_owned_results, large_tensors_in_a_group,
              held_results_of_every_collective,
              out_of_order_and_burst, unnamed_calls, join_and_barrier, errors, sparse,
              optimizer_steps, *staging_checks()]
    hvd.init()
    hvd.init()  # twice is harmless
    if os.environ.get("HOROVODISH_DYNAMIC_PROCESS_SETS") and hvd.size() > 1:
        checks.append(process_sets)
    if os.environ.get("SHUTDOWN_IN_FLIGHT") and hvd.size() > 1:
        checks.append(shutdown_with_work_in_flight)
    run_checks(checks, hvd.rank(), hvd.size())

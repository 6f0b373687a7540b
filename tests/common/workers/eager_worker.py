"""Small steady allreduces that ride on the negotiation (execution/piggyback.py), against
numpy on every rank, bit for bit: every op, dtypes from bool to float64, prescale and
postscale, Average's three rules, in place, into a given output and into runtime
blocks, fused groups of several dtypes; then the cycles that must fall back (another
tensor, another shape on one rank) and sizes that must not ride along.

Each case repeats the same call with new values: the first calls negotiate, after two
alike cycles the next ones are eager. Whether they were is read from the controller's
count and checked, so a runtime that never took the path fails here; with
HOROVODISH_EAGER_LIMIT=0 the worker checks that it never did.

The reference follows Horovod's arithmetic as the executor documents it: each rank's
values times the prescale (float32 for half types, float64 then truncation for
integers), Average's 1/size folded into the prescale for float32/float64, into the
postscale for half types and integers with a postscale, and an exact division toward
zero for integers without one; the sum in the dtype, in rank order; then the postscale.
"""
from __future__ import annotations

import os
import time

import ml_dtypes
import numpy as np

from worker_support import check, close, expect_error, run_checks  # noqa: E402

from horovodish.common import api  # noqa: E402
from horovodish.common.api import collectives, process_state  # noqa: E402
from horovodish.common.errors import RankMismatchError  # noqa: E402
from horovodish.common.messages import ReduceOp  # noqa: E402

EAGER_ON = os.environ.get("HOROVODISH_EAGER_LIMIT", "") != "0"
ROUNDS = 6  # calls per case: 3 to reach steady state, the rest eager
HALF = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))


def eager_cycles() -> int:
    return process_state.state().runtime.controller.eager_cycles


def values(rank: int, count: int, dtype, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed * 31 + rank)
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(count) < 0.5
    high = 6 if dtype.itemsize == 1 else 40
    raw = rng.integers(0 if dtype.kind == "u" else -high, high, count).astype(np.float64)
    if dtype.kind == "f" or dtype in HALF:
        raw += rng.random(count)
    return raw.astype(dtype)


def scaled(data: np.ndarray, factor: float) -> np.ndarray:
    if factor == 1.0:
        return data
    if data.dtype in HALF:
        return (data.astype(np.float32) * np.float32(factor)).astype(data.dtype)
    if data.dtype.kind in "iu":
        return np.trunc(data.astype(np.float64) * factor).astype(data.dtype)
    return (data * data.dtype.type(factor)).astype(data.dtype)


def reference(size: int, count: int, dtype, seed: int, op: ReduceOp, pre: float,
              post: float) -> np.ndarray:
    dtype = np.dtype(dtype)
    divide = False
    if op == ReduceOp.AVERAGE:
        if dtype in (np.float32, np.float64):
            pre = pre / size
        elif dtype.kind in "iu" and post == 1.0:
            divide = True
        else:
            post = post / size
    ufunc = {ReduceOp.SUM: np.add, ReduceOp.AVERAGE: np.add, ReduceOp.MIN: np.minimum,
             ReduceOp.MAX: np.maximum, ReduceOp.PRODUCT: np.multiply}[op]
    if dtype == np.bool_:
        ufunc = {np.add: np.logical_or, np.maximum: np.logical_or,
                 np.minimum: np.logical_and, np.multiply: np.logical_and}[ufunc]
    total = scaled(values(0, count, dtype, seed), pre).copy()
    for rank in range(1, size):
        ufunc(total, scaled(values(rank, count, dtype, seed), pre), out=total)
    if divide:
        quotient = np.floor_divide(total, size)
        total = quotient + ((np.remainder(total, size) != 0) & (quotient < 0))
    return scaled(total.astype(dtype), post)


def bitwise(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """Bit for bit on 2 ranks, where a sum has one rounding whatever the order. On more,
    floating sums round by the order each path adds in (MPI's, the ring's, rank order
    here), so they are compared to a few units in the last place."""
    if api.size() > 2 and (got.dtype.kind == "f" or got.dtype in HALF):
        # atol: an ulp of the largest partial sums (about 200 here), as cancellation
        # leaves small results with the rounding of large ones.
        tol = 3e-2 if got.dtype == HALF[1] else {2: 1e-2, 4: 1e-5, 8: 1e-12}[got.dtype.itemsize]
        check(got.dtype == want.dtype, f"{what}: dtype {got.dtype}, want {want.dtype}")
        close(got.astype(np.float64), want.astype(np.float64), what, tol=tol, atol=200 * tol)
        return
    if not check(got.shape == want.shape and got.dtype == want.dtype,
                 f"{what}: {got.dtype}{got.shape}, want {want.dtype}{want.shape}"):
        return
    same = got.view(np.uint8) == want.view(np.uint8)
    check(same.all(), f"{what}: {int((~same).sum())} bytes differ; got {got[:4]!r}, "
                      f"want {want[:4]!r}")


def _expect_eager(before: int, what: str, rides: bool = True) -> None:
    ran = eager_cycles() - before
    if EAGER_ON and rides:
        check(ran >= ROUNDS - 3, f"{what}: {ran} eager cycles, want {ROUNDS - 3} or more")
    else:
        check(ran == 0, f"{what}: {ran} eager cycles, want none")


CASES = [  # (dtype, op, prescale, postscale)
    (np.float32, ReduceOp.SUM, 1.0, 1.0),
    (np.float32, ReduceOp.AVERAGE, 1.0, 1.0),
    (np.float64, ReduceOp.AVERAGE, 0.3, 2.5),
    (np.float16, ReduceOp.AVERAGE, 1.0, 1.0),
    (np.float16, ReduceOp.SUM, 0.6180339887, 3.3),
    (ml_dtypes.bfloat16, ReduceOp.AVERAGE, 1.0, 1.0),
    (np.int32, ReduceOp.AVERAGE, 1.0, 1.0),
    (np.int64, ReduceOp.AVERAGE, 1.0, 0.5),
    (np.int8, ReduceOp.SUM, 1.0, 1.0),
    (np.uint8, ReduceOp.MAX, 1.0, 1.0),
    (np.float32, ReduceOp.MIN, 1.0, 1.0),
    (np.float64, ReduceOp.PRODUCT, 1.0, 1.0),
    (np.bool_, ReduceOp.SUM, 1.0, 1.0),
    (np.bool_, ReduceOp.MIN, 1.0, 1.0),
]


def every_op_and_dtype_in_place(rank: int, size: int) -> None:
    for index, (dtype, op, pre, post) in enumerate(CASES):
        what = f"{np.dtype(dtype).name} {op.name} pre {pre} post {post}"
        before = eager_cycles()
        for round_ in range(ROUNDS):
            seed = index * 100 + round_
            mine = values(rank, 1001, dtype, seed)
            got = collectives.allreduce_async(mine, mine, f"inplace.{index}", op,
                                              prescale=pre, postscale=post).wait()
            check(got is mine, f"{what}: in place returns the tensor")
            bitwise(mine, reference(size, 1001, dtype, seed, op, pre, post),
                    f"{what}, round {round_}")
        _expect_eager(before, what)


def into_outputs_and_runtime_blocks(rank: int, size: int) -> None:
    before = eager_cycles()
    held = []
    for round_ in range(ROUNDS):
        mine = values(rank, 4099, np.float32, round_)
        kept = mine.copy()
        out = np.full(4099, np.nan, np.float32)
        got = collectives.allreduce_async(mine, out, "given", ReduceOp.SUM).wait()
        check(got is out, "the given output is returned")
        bitwise(out, reference(size, 4099, np.float32, round_, ReduceOp.SUM, 1.0, 1.0),
                f"into the given output, round {round_}")
        owned = collectives.allreduce_async(mine, None, "owned", ReduceOp.AVERAGE).wait()
        want = reference(size, 4099, np.float32, round_, ReduceOp.AVERAGE, 1.0, 1.0)
        bitwise(owned, want, f"into a runtime block, round {round_}")
        bitwise(mine, kept, f"the input is untouched, round {round_}")
        held.append((owned, want))
    for index, (owned, want) in enumerate(held):
        bitwise(owned, want, f"held block {index}, after every later call")
    _expect_eager(before, "outputs and blocks")


def fused_groups_of_several_dtypes(rank: int, size: int) -> None:
    """One grouped call: float32 and int32 and float16 groups, some runtime-owned, some
    into given outputs, share one region."""
    specs = [(np.float32, 7), (np.float32, 300), (np.int32, 33), (np.float16, 5),
             (np.float32, 1)]
    before = eager_cycles()
    for round_ in range(ROUNDS):
        tensors = [values(rank, count, dtype, round_ * 10 + i)
                   for i, (dtype, count) in enumerate(specs)]
        outputs = [t if i % 2 else None for i, t in enumerate(tensors)]
        handles = collectives.grouped_allreduce_async(
            tensors, outputs, [f"group.{i}" for i in range(len(specs))], ReduceOp.SUM)
        for i, ((dtype, count), handle) in enumerate(zip(specs, handles)):
            bitwise(handle.wait(), reference(size, count, dtype, round_ * 10 + i,
                                             ReduceOp.SUM, 1.0, 1.0),
                    f"group tensor {i} ({np.dtype(dtype).name}), round {round_}")
    _expect_eager(before, "fused groups")


def a_rank_with_more_work_falls_back(rank: int, size: int) -> None:
    """In steady state, the last rank adds a tensor once: that cycle cannot ride along;
    every tensor still reduces right, and the steady one rides again after."""
    want = reference(size, 8, np.float64, 99, ReduceOp.SUM, 1.0, 1.0)
    for round_ in range(ROUNDS + 2):
        mine = values(rank, 64, np.float32, round_)
        extra = None
        if round_ == ROUNDS - 1 and rank == size - 1:  # in the same cycle as "steady"
            extra = collectives.allreduce_async(values(rank, 8, np.float64, 99), None,
                                                "extra", ReduceOp.SUM)
        handle = collectives.allreduce_async(mine, mine, "steady", ReduceOp.SUM)
        bitwise(handle.wait(), reference(size, 64, np.float32, round_, ReduceOp.SUM,
                                         1.0, 1.0), f"steady tensor, round {round_}")
        if round_ == ROUNDS - 1:
            if extra is None:  # the other ranks, a cycle later
                extra = collectives.allreduce_async(values(rank, 8, np.float64, 99), None,
                                                    "extra", ReduceOp.SUM)
            bitwise(extra.wait(), want, "the extra tensor")
    before = eager_cycles()
    for round_ in range(ROUNDS):
        mine = values(rank, 64, np.float32, round_)
        collectives.allreduce_async(mine, mine, "steady", ReduceOp.SUM).wait()
    _expect_eager(before, "steady again after the extra tensor")


def a_shape_change_on_one_rank_is_an_error_everywhere(rank: int, size: int) -> None:
    for round_ in range(ROUNDS):
        mine = values(rank, 16, np.float32, round_)
        collectives.allreduce_async(mine, mine, "shape", ReduceOp.SUM).wait()
    odd = values(rank, 17 if rank == 0 else 16, np.float32, 0)
    expect_error(lambda: collectives.allreduce_async(odd, odd, "shape", ReduceOp.SUM).wait(),
                 RankMismatchError, "shape", what="one rank's shape differs")
    mine = values(rank, 16, np.float32, 7)
    collectives.allreduce_async(mine, mine, "shape", ReduceOp.SUM).wait()
    bitwise(mine, reference(size, 16, np.float32, 7, ReduceOp.SUM, 1.0, 1.0),
            "the same name afterwards")


def not_while_a_timeline_records(rank: int, size: int) -> None:
    """Rank 0 records a timeline (its op spans come from the ordinary path): no cycle
    rides along, on any rank, and every call still reduces right."""
    runtime = process_state.state().runtime
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"eager_timeline_{os.getpid()}.json")
    runtime.start_timeline(path)
    try:
        before = eager_cycles()
        for round_ in range(ROUNDS):
            mine = values(rank, 64, np.float32, round_)
            collectives.allreduce_async(mine, mine, "recorded", ReduceOp.SUM).wait()
            bitwise(mine, reference(size, 64, np.float32, round_, ReduceOp.SUM, 1.0, 1.0),
                    f"recorded, round {round_}")
        _expect_eager(before, "while a timeline records", rides=False)
        plan = runtime.eager.plan if runtime.eager is not None else None
        check(plan is None, f"while a timeline records, a plan for bits {plan and plan.bits}: "
                            "each one would be missed")
    finally:
        runtime.stop_timeline()
        if os.path.exists(path):
            os.remove(path)


def split_limit() -> int:
    """Bytes a rank up to which plans go by slices here (0: not at all): on one host."""
    eager = process_state.state().runtime.eager
    return eager.split_limit if eager is not None else 0


def mid_sizes_reduced_by_slices(rank: int, size: int) -> None:
    """Above the limit, on one host, up to the split limit: each rank reduces its slice
    (counts that do not divide by the ranks), the ranks meet again, each copies every
    slice out. In place, into a given output, into runtime blocks, and a fused group."""
    cases = [  # (dtype, count, op, output: "in place", "given" or "owned")
        (np.float32, 200_003, ReduceOp.SUM, "in place"),
        (np.float16, 150_001, ReduceOp.AVERAGE, "owned"),
        (np.int32, 100_003, ReduceOp.AVERAGE, "given"),
        (np.float64, 70_001, ReduceOp.MAX, "in place"),
    ]
    for index, (dtype, count, op, where) in enumerate(cases):
        what = f"{np.dtype(dtype).name} x {count} {op.name} {where}"
        before = eager_cycles()
        for round_ in range(ROUNDS):
            seed = 500 + index * 10 + round_
            mine = values(rank, count, dtype, seed)
            output = {"in place": mine, "given": np.empty_like(mine), "owned": None}[where]
            got = collectives.allreduce_async(mine, output, f"mid.{index}", op).wait()
            bitwise(got, reference(size, count, dtype, seed, op, 1.0, 1.0),
                    f"{what}, round {round_}")
        _expect_eager(before, what, rides=split_limit() > 0)
    specs = [(np.float32, 50_001), (np.int64, 30_001), (np.float32, 7)]
    before = eager_cycles()
    for round_ in range(ROUNDS):
        tensors = [values(rank, count, dtype, 600 + round_ * 10 + i)
                   for i, (dtype, count) in enumerate(specs)]
        outputs = [t if i % 2 else None for i, t in enumerate(tensors)]
        handles = collectives.grouped_allreduce_async(
            tensors, outputs, [f"midgroup.{i}" for i in range(len(specs))], ReduceOp.SUM)
        for i, ((dtype, count), handle) in enumerate(zip(specs, handles)):
            bitwise(handle.wait(), reference(size, count, dtype, 600 + round_ * 10 + i,
                                             ReduceOp.SUM, 1.0, 1.0),
                    f"mid group tensor {i}, round {round_}")
    _expect_eager(before, "a fused mid-size group", rides=split_limit() > 0)


def large_tensors_never_ride_along(rank: int, size: int) -> None:
    before = eager_cycles()
    for round_ in range(ROUNDS):
        mine = values(rank, 1 << 20, np.float32, round_)  # 4 MiB
        collectives.allreduce_async(mine, mine, "large", ReduceOp.SUM).wait()
        bitwise(mine, reference(size, 1 << 20, np.float32, round_, ReduceOp.SUM, 1.0, 1.0),
                f"4 MiB, round {round_}")
    _expect_eager(before, "4 MiB", rides=False)


def a_late_reader_reads_its_own_cycle(rank: int, size: int) -> None:
    """Rank 0 reads the gathered regions 2 ms late; the others meanwhile finish and start
    the next call, writing their next regions. Those must go to other slots than the
    ones rank 0 is still to read (shm_exchange.py: sets of slots taken in turn)."""
    executor = process_state.state().runtime.executor
    before = eager_cycles()
    rounds = 2 * ROUNDS
    inputs = [values(rank, 256, np.float32, round_) for round_ in range(rounds)]
    wants = [reference(size, 256, np.float32, round_, ReduceOp.SUM, 1.0, 1.0)
             for round_ in range(rounds)]
    if rank == 0:
        reduce = executor.execute_gathered

        def late(*args):
            time.sleep(0.002)
            return reduce(*args)
        executor.execute_gathered = late
    try:
        for round_ in range(rounds):  # nothing between the calls: the others race ahead
            collectives.allreduce_async(inputs[round_], inputs[round_], "late.reader",
                                        ReduceOp.SUM, waited=True).wait()
    finally:
        executor.__dict__.pop("execute_gathered", None)
    for round_ in range(rounds):
        bitwise(inputs[round_], wants[round_], f"late reader, round {round_}")
    _expect_eager(before, "a late reader")


def negotiation_in_shared_memory_on_one_host(rank: int, size: int) -> None:
    """On one host every cycle meets through shared memory (shm_exchange.py), eager or
    not: MPI's negotiation allreduce is never even set up. Between hosts (as
    HOROVODISH_TEST_NO_SHM_EXCHANGE makes it: tests/mpi_variants.py) it is MPI's."""
    transport = process_state.state().runtime.controller.transport
    shared = transport._shm
    if not os.environ.get("HOROVODISH_TEST_NO_SHM_EXCHANGE"):  # the tests run on one host
        check(shared is not None, "every rank on one host, yet no shared-memory exchange")
    meetings = shared._barrier._meeting if shared is not None else 0
    for round_ in range(ROUNDS):  # 4 MiB: never eager, so a plain negotiation each
        mine = values(rank, 1 << 20, np.float32, round_)
        collectives.allreduce_async(mine, mine, "large.again", ReduceOp.SUM).wait()
        bitwise(mine, reference(size, 1 << 20, np.float32, round_, ReduceOp.SUM, 1.0, 1.0),
                f"4 MiB again, round {round_}")
        if round_ == ROUNDS - 2:  # read while no rank can have shut down (which closes it)
            by_mpi = transport._persistent is not None
            meetings = (shared._barrier._meeting if shared is not None else 0) - meetings
    if shared is not None:
        check(not by_mpi, "one host, yet MPI's negotiation allreduce was set up")
        check(meetings >= ROUNDS - 1,
              f"{meetings} shared-memory meetings in {ROUNDS - 1} cycles")
    else:
        check(by_mpi, "no shared memory, yet no MPI negotiation")

if __name__ == "__main__":
    api.init()
    run_checks([every_op_and_dtype_in_place, into_outputs_and_runtime_blocks,
                fused_groups_of_several_dtypes, a_rank_with_more_work_falls_back,
                a_shape_change_on_one_rank_is_an_error_everywhere,
                not_while_a_timeline_records, mid_sizes_reduced_by_slices,
                large_tensors_never_ride_along, a_late_reader_reads_its_own_cycle,
                negotiation_in_shared_memory_on_one_host],
               api.rank(), api.size())
    api.shutdown()
